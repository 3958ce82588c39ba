const test = require("node:test");
const assert = require("node:assert");
const { greet, double } = require("../src/index.js");

test("greets", () => {
  assert.strictEqual(greet("belay"), "hello, belay");
});

test("doubles numbers and refuses the rest", () => {
  assert.strictEqual(double("21"), 42);
  assert.throws(() => double("x"), TypeError);
});
