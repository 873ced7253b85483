//! The sampling loop's settings of a picture (issue 42): the sampler and the sigma schedule by
//! name, the step cache and the guidance window. Their JSON forms (the same in the picture's
//! metadata, batch list items and server requests) and their rules.
//!
//! - `sampler`, `schedule`: the name (`"dpm++2m"`, `"karras"`).
//! - `cache`: `"off"`, a method's name (cache-dit's defaults for it), or an object with the
//!   `method` and any of cache-dit's `DBCacheConfig` fields (`Fn_compute_blocks`,
//!   `Bn_compute_blocks`, `residual_diff_threshold`, `max_warmup_steps`, `max_cached_steps`,
//!   `max_continuous_cached_steps`; −1: no limit) and `taylorseer_order`; a picture records the
//!   object with every field.
//! - `guidance_window`: `[A, B]` (the metadata's form, as `skip_window`) or `"A:B"`.

use crate::cache::{CacheConfig, Method};
use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::str::FromStr;

/// TaylorSeer orders accepted (the ones checked against cache-dit: tests/cache.rs).
pub const TAYLOR_ORDERS: std::ops::RangeInclusive<usize> = 1..=2;

/// A guidance or skip window `A:B` must have `0 <= A <= B <= 1`.
pub fn check_window(what: &str, (a, b): (f64, f64)) -> Result<(), String> {
    if !(a.is_finite() && b.is_finite() && 0.0 <= a && a <= b && b <= 1.0) {
        return Err(format!("{what} {a}:{b} is not A:B with 0 <= A <= B <= 1"));
    }
    Ok(())
}

/// A cache's parameters, each named as cache-dit names it (the transformer's block count is the
/// pipeline's check: [`check_cache_blocks`]).
pub fn check_cache(c: &CacheConfig) -> Result<(), String> {
    if c.fn_blocks == 0 {
        return Err("cache Fn_compute_blocks 0: at least one first block must run (F >= 1)".into());
    }
    if !(c.threshold.is_finite() && (0.0..=1.0).contains(&c.threshold)) {
        return Err(format!("cache residual_diff_threshold {} is not in 0..=1 (0: never cache, 1: always past the warm-up)", c.threshold));
    }
    if c.method == Method::FbCache && (c.fn_blocks, c.bn_blocks) != (1, 0) {
        return Err(format!("fbcache is F1B0, not F{}B{}; give dbcache for other compute blocks", c.fn_blocks, c.bn_blocks));
    }
    match c.method {
        Method::TaylorSeer if !TAYLOR_ORDERS.contains(&c.taylor_order) => {
            Err(format!("taylorseer_order {} is not {} or {}", c.taylor_order, TAYLOR_ORDERS.start(), TAYLOR_ORDERS.end()))
        }
        Method::TaylorSeer => Ok(()),
        _ if c.taylor_order != 0 => Err(format!("taylorseer_order goes with the taylorseer cache, not {}", c.method)),
        _ => Ok(()),
    }
}

/// The first and last compute blocks must fit the transformer's `blocks`.
pub fn check_cache_blocks(c: &CacheConfig, blocks: usize) -> Result<(), String> {
    if c.fn_blocks + c.bn_blocks > blocks {
        return Err(format!("cache F{}B{}: the transformer has {blocks} blocks (Fn_compute_blocks + Bn_compute_blocks <= {blocks})", c.fn_blocks, c.bn_blocks));
    }
    Ok(())
}

/// The cache's name on the command line and in lists: `off` or the method.
pub fn cache_name(c: &Option<CacheConfig>) -> &'static str {
    c.map_or("off", |c| c.method.name())
}

/// The accepted cache names, for messages.
pub fn cache_names() -> String {
    format!("off, {}", Method::names())
}

/// `"off"` or a method's name, with cache-dit's defaults.
pub fn parse_cache_name(s: &str) -> Result<Option<CacheConfig>, String> {
    match s {
        "off" => Ok(None),
        _ => s.parse::<Method>().map(|m| Some(CacheConfig::defaults(m))),
    }
}

/// cache-dit's limit form: −1 is no limit.
fn limit(v: Option<usize>) -> i64 {
    v.map_or(-1, |v| v as i64)
}

fn from_limit(field: &str, v: i64) -> Result<Option<usize>, String> {
    match v {
        -1 => Ok(None),
        v if v >= 0 => Ok(Some(v as usize)),
        v => Err(format!("{field} {v} is not -1 (no limit) or a count >= 0")),
    }
}

/// The object form, fields named as cache-dit's `DBCacheConfig`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheObject {
    method: String,
    #[serde(rename = "Fn_compute_blocks", default, skip_serializing_if = "Option::is_none")]
    fn_blocks: Option<usize>,
    #[serde(rename = "Bn_compute_blocks", default, skip_serializing_if = "Option::is_none")]
    bn_blocks: Option<usize>,
    #[serde(rename = "residual_diff_threshold", default, skip_serializing_if = "Option::is_none")]
    threshold: Option<f64>,
    #[serde(rename = "max_warmup_steps", default, skip_serializing_if = "Option::is_none")]
    warmup: Option<usize>,
    #[serde(rename = "max_cached_steps", default, skip_serializing_if = "Option::is_none")]
    max_cached: Option<i64>,
    #[serde(rename = "max_continuous_cached_steps", default, skip_serializing_if = "Option::is_none")]
    max_continuous: Option<i64>,
    #[serde(rename = "taylorseer_order", default, skip_serializing_if = "Option::is_none")]
    taylor_order: Option<usize>,
}

/// The cache a JSON value names ([`parse_cache_name`]'s strings, or the object form over the
/// method's defaults). Its rules are [`check_cache`]'s.
pub fn cache_of_json(v: &Value) -> Result<Option<CacheConfig>, String> {
    if let Some(s) = v.as_str() {
        return parse_cache_name(s);
    }
    if !v.is_object() {
        return Err(format!("`cache` must be a name ({}) or an object with a `method`, got {v}", cache_names()));
    }
    let o: CacheObject = serde_json::from_value(v.clone()).map_err(|e| format!("`cache`: {e}"))?;
    let Some(mut c) = parse_cache_name(&o.method)? else {
        return match o.has_parameters() {
            false => Ok(None),
            true => Err("`cache`: the method `off` takes no parameters".into()),
        };
    };
    c.fn_blocks = o.fn_blocks.unwrap_or(c.fn_blocks);
    c.bn_blocks = o.bn_blocks.unwrap_or(c.bn_blocks);
    c.threshold = o.threshold.unwrap_or(c.threshold);
    c.warmup = o.warmup.unwrap_or(c.warmup);
    if let Some(m) = o.max_cached {
        c.max_cached = from_limit("max_cached_steps", m)?;
    }
    if let Some(m) = o.max_continuous {
        c.max_continuous = from_limit("max_continuous_cached_steps", m)?;
    }
    c.taylor_order = o.taylor_order.unwrap_or(c.taylor_order);
    Ok(Some(c))
}

/// The form a picture records: `"off"`, or the object with every field.
pub fn cache_to_json(c: &Option<CacheConfig>) -> Value {
    let Some(c) = c else { return Value::from("off") };
    let o = CacheObject {
        method: c.method.name().into(),
        fn_blocks: Some(c.fn_blocks),
        bn_blocks: Some(c.bn_blocks),
        threshold: Some(c.threshold),
        warmup: Some(c.warmup),
        max_cached: Some(limit(c.max_cached)),
        max_continuous: Some(limit(c.max_continuous)),
        taylor_order: (c.taylor_order > 0).then_some(c.taylor_order),
    };
    serde_json::to_value(o).expect("the cache serialises")
}

impl CacheObject {
    fn has_parameters(&self) -> bool {
        self.fn_blocks.is_some()
            || self.bn_blocks.is_some()
            || self.threshold.is_some()
            || self.warmup.is_some()
            || self.max_cached.is_some()
            || self.max_continuous.is_some()
            || self.taylor_order.is_some()
    }
}

/// A window from JSON: `[A, B]` or `"A:B"` (checked by [`check_window`]).
pub fn window_of_json(what: &str, v: &Value) -> Result<(f64, f64), String> {
    let w = match v {
        Value::String(s) => parse_window(s)?,
        Value::Array(a) if a.len() == 2 && a.iter().all(Value::is_number) => (a[0].as_f64().unwrap_or(f64::NAN), a[1].as_f64().unwrap_or(f64::NAN)),
        _ => return Err(format!("`{what}` must be \"A:B\" or [A, B], got {v}")),
    };
    check_window(what, w)?;
    Ok(w)
}

/// `A:B` (two numbers), unchecked.
pub fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let bad = || format!("window `{s}` is not A:B");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let p = |v: &str| v.trim().parse::<f64>().map_err(|_| bad());
    Ok((p(a)?, p(b)?))
}

/// serde for the sampler and the schedule: by name, an unknown one listing the accepted.
pub(super) mod by_name {
    use super::*;

    pub fn serialize<T: std::fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T: FromStr<Err = String>, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

/// serde for the cache ([`cache_to_json`], [`cache_of_json`]).
pub(super) mod cache_form {
    use super::*;

    pub fn serialize<S: Serializer>(c: &Option<CacheConfig>, s: S) -> Result<S::Ok, S::Error> {
        cache_to_json(c).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CacheConfig>, D::Error> {
        cache_of_json(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// The full window `0:1` (every step guided): the default.
pub(super) fn full_window() -> (f64, f64) {
    (0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cache_forms_round_trip_and_fill_defaults() {
        assert_eq!(cache_of_json(&json!("off")), Ok(None));
        let db = CacheConfig::defaults(Method::DbCache);
        assert_eq!(cache_of_json(&json!("dbcache")), Ok(Some(db)));
        let c = cache_of_json(&json!({"method": "dbcache", "residual_diff_threshold": 0.12, "max_cached_steps": 5})).unwrap().unwrap();
        assert_eq!(c, CacheConfig { threshold: 0.12, max_cached: Some(5), ..db });
        for m in [Method::DbCache, Method::FbCache, Method::TaylorSeer] {
            let c = Some(CacheConfig { max_continuous: Some(2), ..CacheConfig::defaults(m) });
            assert_eq!(cache_of_json(&cache_to_json(&c)), Ok(c), "{m}");
        }
        assert_eq!(cache_to_json(&None), json!("off"));
        let t = cache_to_json(&Some(CacheConfig::defaults(Method::TaylorSeer)));
        assert_eq!(
            t,
            json!({"method": "taylorseer", "Fn_compute_blocks": 8, "Bn_compute_blocks": 0, "residual_diff_threshold": 0.08,
                   "max_warmup_steps": 8, "max_cached_steps": -1, "max_continuous_cached_steps": -1, "taylorseer_order": 1})
        );
    }

    #[test]
    fn bad_caches_name_what_is_accepted() {
        let e = cache_of_json(&json!("teacache")).unwrap_err();
        assert!(e.contains("teacache") && e.contains("off") && e.contains("taylorseer"), "{e}");
        let e = cache_of_json(&json!({"method": "dbcache", "Fn": 3})).unwrap_err();
        assert!(e.contains("Fn") && e.contains("Fn_compute_blocks"), "{e}");
        assert!(cache_of_json(&json!({"method": "dbcache", "max_cached_steps": -2})).unwrap_err().contains("-1"));
        assert!(cache_of_json(&json!({"method": "off", "max_warmup_steps": 2})).is_err());
        assert!(cache_of_json(&json!(3)).is_err());
        let bad = |c: CacheConfig, word: &str| {
            let e = check_cache(&c).unwrap_err();
            assert!(e.contains(word), "{e}");
        };
        let db = CacheConfig::defaults(Method::DbCache);
        bad(CacheConfig { fn_blocks: 0, ..db }, "F >= 1");
        bad(CacheConfig { threshold: 1.5, ..db }, "0..=1");
        bad(CacheConfig { threshold: f64::NAN, ..db }, "0..=1");
        bad(CacheConfig { fn_blocks: 2, ..CacheConfig::defaults(Method::FbCache) }, "F1B0");
        bad(CacheConfig { taylor_order: 3, ..CacheConfig::defaults(Method::TaylorSeer) }, "1 or 2");
        bad(CacheConfig { taylor_order: 1, ..db }, "taylorseer");
        assert!(check_cache(&db).is_ok());
        assert!(check_cache_blocks(&db, 8).is_ok());
        assert!(check_cache_blocks(&CacheConfig { bn_blocks: 1, ..db }, 8).unwrap_err().contains("8 blocks"));
    }

    #[test]
    fn windows() {
        assert_eq!(window_of_json("guidance_window", &json!("0:0.5")), Ok((0.0, 0.5)));
        assert_eq!(window_of_json("guidance_window", &json!([0.25, 1])), Ok((0.25, 1.0)));
        for bad in [json!("0.5:0.2"), json!("1:2"), json!([0, 1, 2]), json!("a:b"), json!(0.5), json!([-0.1, 0.5])] {
            let e = window_of_json("guidance_window", &bad).unwrap_err();
            assert!(e.contains("A:B"), "{bad}: {e}");
        }
    }
}
