//! Validation of a manifest against the JSON Schema that `k8s-openapi`
//! derives from the Kubernetes OpenAPI definitions (its `schemars` feature):
//! types, integer formats, required fields, and no field the schema lacks.

use serde_json::Value;

pub fn job_schema() -> Value {
    let s = schemars::schema_for!(k8s_openapi::api::batch::v1::Job);
    serde_json::to_value(s).unwrap()
}

pub fn validate(root: &Value, doc: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(root, root, doc, "", &mut errors);
    errors
}

fn resolve<'a>(root: &'a Value, mut s: &'a Value) -> &'a Value {
    while let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let ptr = r.trim_start_matches('#');
        s = root
            .pointer(ptr)
            .unwrap_or_else(|| panic!("unresolved $ref {r}"));
    }
    s
}

fn type_ok(t: &str, v: &Value, format: Option<&str>) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => match (v.as_i64(), format) {
            (Some(n), Some("int32")) => i32::try_from(n).is_ok(),
            (Some(_), _) => true,
            _ => false,
        },
        _ => true,
    }
}

fn check(root: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let s = resolve(root, schema);
    if s == &Value::Bool(true) {
        return;
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(list) = s.get(key).and_then(Value::as_array) {
            let ok: Vec<bool> = list
                .iter()
                .map(|sub| {
                    let mut e = Vec::new();
                    check(root, sub, v, at, &mut e);
                    e.is_empty()
                })
                .collect();
            let passed = ok.iter().filter(|b| **b).count();
            let fine = match key {
                "allOf" => passed == list.len(),
                "anyOf" => passed > 0,
                _ => passed == 1,
            };
            if !fine {
                errors.push(format!("{at}: does not match {key}"));
            }
        }
    }
    let format = s.get("format").and_then(Value::as_str);
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.iter().any(|t| type_ok(t, v, format)) {
            errors.push(format!("{at}: expected {types:?}, got {v}"));
            return;
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array) {
        if !allowed.contains(v) {
            errors.push(format!("{at}: {v} is not one of {allowed:?}"));
        }
    }
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for req in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = req.as_str().unwrap_or_default();
            if !obj.contains_key(name) {
                errors.push(format!("{at}: missing {name}"));
            }
        }
        let extra = s.get("additionalProperties");
        for (k, val) in obj {
            let here = format!("{at}/{k}");
            match (props.and_then(|p| p.get(k)), extra) {
                (Some(sub), _) => check(root, sub, val, &here, errors),
                (None, Some(sub)) if sub.is_object() || sub == &Value::Bool(true) => {
                    check(root, sub, val, &here, errors)
                }
                (None, _) if props.is_some() => {
                    errors.push(format!("{here}: not a field of this object"))
                }
                _ => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, val) in arr.iter().enumerate() {
            check(root, items, val, &format!("{at}/{i}"), errors);
        }
    }
}
