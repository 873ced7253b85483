//! A request's sampling-loop fields (moss's extensions, as batch list items take them):
//! `sampler` and `schedule` by name, `cache` (`"off"`, a method's name, or cache-dit's object
//! form) and `guidance_window` (`"A:B"` or `[A, B]`). Each refusal is a 400 naming the field and
//! what it accepts.

use super::api::{ApiError, Limits};
use crate::spec::{cache_of_json, check_cache, check_cache_blocks, window_of_json, PictureSpec};
use serde_json::Value;

/// Write the fields `get` finds over `spec`.
pub fn parse<'a>(spec: &mut PictureSpec, get: &dyn Fn(&str) -> Option<&'a Value>, lim: &Limits) -> Result<(), ApiError> {
    let bad = |k: &'static str| move |e: String| ApiError::bad(k, "invalid_value", e);
    let name = |k: &str, v: &Value| -> Result<String, ApiError> {
        v.as_str().map(str::to_string).ok_or_else(|| ApiError::bad(k, "invalid_type", format!("`{k}` must be a string, got {v}")))
    };
    if let Some(v) = get("sampler") {
        spec.sampler = name("sampler", v)?.parse().map_err(bad("sampler"))?;
    }
    if let Some(v) = get("schedule") {
        spec.schedule = name("schedule", v)?.parse().map_err(bad("schedule"))?;
    }
    if let Some(v) = get("cache") {
        spec.cache = cache_of_json(v).map_err(bad("cache"))?;
        if let Some(c) = &spec.cache {
            check_cache(c).map_err(bad("cache"))?;
            check_cache_blocks(c, lim.dit_blocks).map_err(bad("cache"))?;
            if lim.devices > 1 {
                let why = format!("step caching runs on one device; this server spreads each picture over {} devices (--devices)", lim.devices);
                return Err(ApiError::bad("cache", "invalid_value", why));
            }
        }
    }
    if let Some(v) = get("guidance_window") {
        spec.guidance_window = window_of_json("guidance_window", v).map_err(bad("guidance_window"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::options::Precision;
    use crate::serve::api::{base_request, parse, Limits};

    fn lim() -> Limits {
        Limits { max_steps: 100, max_pixels: 1024 * 1024, max_tokens: 4096, dit_blocks: 4, previews: true, devices: 1 }
    }

    #[test]
    fn loop_fields_reach_the_spec() {
        let base = base_request(vec![22], (0.0, 1.0), 4096, Precision::Bf16);
        let body = br#"{"prompt":"x","sampler":"heun","schedule":"karras","cache":{"method":"dbcache","Fn_compute_blocks":2,"Bn_compute_blocks":1},"guidance_window":"0:0.5","stream":true,"partial_images":2}"#;
        let g = parse(body, &lim(), &["m"], &base, 1).unwrap();
        let s = &g.req.spec;
        assert_eq!((s.sampler.name(), s.schedule.name(), s.guidance_window, g.partial_images), ("heun", "karras", (0.0, 0.5), 2));
        let c = s.cache.unwrap();
        assert_eq!((c.method.name(), c.fn_blocks, c.bn_blocks, c.threshold), ("dbcache", 2, 1, 0.08));
        let g = parse(br#"{"prompt":"x","cache":"fbcache","guidance_window":[0.1,0.9]}"#, &lim(), &["m"], &base, 1).unwrap();
        assert_eq!((g.req.spec.cache.unwrap().fn_blocks, g.req.spec.guidance_window), (1, (0.1, 0.9)));
        let g = parse(br#"{"prompt":"x"}"#, &lim(), &["m"], &base, 1).unwrap();
        assert_eq!(g.req.spec, crate::spec::PictureSpec { prompt: "x".into(), seed: 1, ..base.spec.clone() }, "absent: the server's defaults");
    }

    #[test]
    fn bad_loop_fields_are_400_naming_the_field_and_the_accepted() {
        let cases: [(&[u8], &str, &str); 11] = [
            (br#"{"prompt":"x","sampler":"dpmpp_2m"}"#, "sampler", "euler_ancestral"),
            (br#"{"prompt":"x","sampler":3}"#, "sampler", "string"),
            (br#"{"prompt":"x","schedule":"normal"}"#, "schedule", "sgm_uniform"),
            (br#"{"prompt":"x","cache":"teacache"}"#, "cache", "taylorseer"),
            (br#"{"prompt":"x","cache":{"method":"dbcache","residual_diff_threshold":2}}"#, "cache", "0..=1"),
            (br#"{"prompt":"x","cache":{"method":"dbcache"}}"#, "cache", "4 blocks"),
            (br#"{"prompt":"x","cache":{"method":"fbcache","Fn":1}}"#, "cache", "Fn_compute_blocks"),
            (br#"{"prompt":"x","guidance_window":"0.6:0.2"}"#, "guidance_window", "A:B"),
            (br#"{"prompt":"x","partial_images":4,"stream":true}"#, "partial_images", "0..=3"),
            (br#"{"prompt":"x","partial_images":1}"#, "partial_images", "stream"),
            (br#"{"prompt":"x","partial_images":1,"stream":true,"n":1,"sede":1}"#, "sede", "guidance_window"),
        ];
        let base = base_request(vec![], (0.0, 1.0), 4096, Precision::Bf16);
        for (body, param, word) in cases {
            let e = parse(body, &lim(), &["m"], &base, 0).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{}: {e:?}", String::from_utf8_lossy(body));
            assert!(e.message.contains(word), "{}: {}", String::from_utf8_lossy(body), e.message);
        }
        let no_vae = Limits { previews: false, ..lim() };
        let e = parse(br#"{"prompt":"x","partial_images":1,"stream":true}"#, &no_vae, &["m"], &base, 0).unwrap_err();
        assert!(e.message.contains("VAE"), "{}", e.message);
    }
}
