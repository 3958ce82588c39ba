const isNumber = require("is-number");

function greet(name) {
  return `hello, ${name}`;
}

function double(x) {
  if (!isNumber(x)) {
    throw new TypeError(`not a number: ${x}`);
  }
  return Number(x) * 2;
}

module.exports = { greet, double };
