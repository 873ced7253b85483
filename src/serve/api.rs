//! The wire format of `POST /v1/images/generations` (OpenAI's, with the extensions sglang and
//! vllm-omni accept) and the OpenAI error envelope. Every field is checked here, before a request
//! is queued; an unknown field is a 400 that names it.

use crate::options::Precision;
use crate::pipeline::Request;
use crate::spec::PictureSpec;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// Fields moss reads.
pub const FIELDS: [&str; 18] = [
    "prompt",
    "model",
    "n",
    "size",
    "response_format",
    "output_format",
    "output_compression",
    "negative_prompt",
    "seed",
    "num_inference_steps",
    "guidance_scale",
    "stream",
    "partial_images",
    "lora",
    "sampler",
    "schedule",
    "cache",
    "guidance_window",
];

/// Most partial images a picture streams (OpenAI's bound).
pub const MAX_PARTIAL_IMAGES: u64 = 3;

/// Standard OpenAI fields moss has no use for: accepted and ignored.
pub const IGNORED: [&str; 5] = ["quality", "style", "user", "background", "moderation"];

/// Most pictures one request may ask for.
pub const MAX_N: u64 = 8;

/// An error in the OpenAI envelope `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: &'static str,
    /// Seconds, for 429 (and 503 while loading).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None, code, retry_after: None }
    }
    pub fn bad(param: &str, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::new(StatusCode::BAD_REQUEST, code, message) }
    }
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }
    /// The envelope's `type`, as OpenAI names them.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// Server-side bounds on a request.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_steps: u32,
    /// Largest picture area, W x H.
    pub max_pixels: u64,
    /// Most prompt tokens (each of the prompt and the negative).
    pub max_tokens: usize,
    /// The transformer's blocks (a step cache's compute blocks must fit in them).
    pub dit_blocks: usize,
    /// Whether the VAE stays loaded beside the transformer, so partial images can be decoded
    /// while a picture denoises.
    pub previews: bool,
    /// The devices each picture is spread over (`--devices`; step caching needs one).
    pub devices: usize,
}

/// A checked request: the first picture's settings (picture i uses `seed + i`), how many, and
/// whether the answer streams.
#[derive(Clone, Debug)]
pub struct Generation {
    pub req: Request,
    pub n: u32,
    pub stream: bool,
    /// `output_format`: `png`, `jpeg` or `webp` (its `req.out` carries the extension the
    /// picture is encoded by, as `moss generate -o` does).
    pub format: &'static str,
    /// Partial images each picture streams (`partial_images`, 0..=3).
    pub partial_images: usize,
}

/// The default `output_compression` of a JPEG (OpenAI's: 100).
pub const DEFAULT_COMPRESSION: u64 = 100;

/// The request a body's fields are written over: moss generate's defaults (50 steps, guidance 3,
/// 1024x1024, no negative) and the server's settings (`uncond_skip`, `skip_window`, ...).
pub fn base_request(uncond_skip: Vec<usize>, skip_window: (f64, f64), max_tokens: usize, precision: Precision) -> Request {
    let spec = PictureSpec { seed: 0, uncond_skip, skip_window, max_tokens, precision, ..PictureSpec::default() };
    Request::new(spec, Default::default(), crate::backend::Device::Cpu)
}

fn string<'a>(k: &str, v: &'a Value) -> Result<&'a str, ApiError> {
    v.as_str().ok_or_else(|| ApiError::bad(k, "invalid_type", format!("`{k}` must be a string, got {v}")))
}

fn whole(k: &str, v: &Value) -> Result<u64, ApiError> {
    v.as_u64().ok_or_else(|| ApiError::bad(k, "invalid_type", format!("`{k}` must be a whole number >= 0, got {v}")))
}

/// Parse and check a request body over `base` ([`base_request`]). `models`: the names the served
/// model answers to, its id (`GET /v1/models`) first; `random_seed`: the seed of a request that
/// sets none.
pub fn parse(body: &[u8], lim: &Limits, models: &[&str], base: &Request, random_seed: u64) -> Result<Generation, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", format!("the body is not valid JSON: {e}")))?;
    let obj: &Map<String, Value> = v.as_object().ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", "the body must be one JSON object"))?;
    check_known(obj, &FIELDS, &IGNORED)?;
    parse_fields(obj, lim, models, base, random_seed)
}

/// Every key of `obj` is one of `fields` or `ignored`; else a 400 naming the unknown ones.
pub fn check_known(obj: &Map<String, Value>, fields: &[&str], ignored: &[&str]) -> Result<(), ApiError> {
    let unknown: Vec<&str> = obj.keys().map(String::as_str).filter(|k| !fields.contains(k) && !ignored.contains(k)).collect();
    if !unknown.is_empty() {
        let names = unknown.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        return Err(ApiError::bad(
            unknown[0],
            "unknown_parameter",
            format!("unknown field {names} (known: {}; accepted and ignored: {})", fields.join(", "), ignored.join(", ")),
        ));
    }
    Ok(())
}

/// [`parse`]'s checks of the fields of the generations' set in `obj` (its keys already checked).
pub fn parse_fields(obj: &Map<String, Value>, lim: &Limits, models: &[&str], base: &Request, random_seed: u64) -> Result<Generation, ApiError> {
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let mut g = Generation { req: base.clone(), n: 1, stream: false, format: "png", partial_images: 0 };
    g.req.spec.seed = random_seed;
    g.req.spec.steps = base.spec.steps.min(lim.max_steps);
    match get("prompt") {
        None => return Err(ApiError::bad("prompt", "missing_required_parameter", "`prompt` is required")),
        Some(v) => g.req.spec.prompt = string("prompt", v)?.to_string(),
    }
    if let Err(e) = g.req.spec.check_prompt() {
        return Err(ApiError::bad("prompt", "invalid_value", format!("`prompt`: {e}")));
    }
    if let Some(v) = get("model") {
        let m = string("model", v)?;
        if !models.contains(&m) {
            let mut e = ApiError::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("model `{m}` is not served here; this server serves `{}` (GET /v1/models)", models.join("`, `")),
            );
            e.param = Some("model".into());
            return Err(e);
        }
    }
    if let Some(v) = get("n") {
        let n = whole("n", v)?;
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::bad("n", "invalid_value", format!("`n` must be in 1..={MAX_N}, got {n}")));
        }
        g.n = n as u32;
    }
    if let Some(v) = get("size") {
        let s = string("size", v)?;
        if s != "auto" {
            (g.req.spec.width, g.req.spec.height) =
                crate::options::parse_size(s).map_err(|e| ApiError::bad("size", "invalid_value", format!("`size` {s}: {e}")))?;
        }
    }
    if let Some(v) = get("response_format") {
        match string("response_format", v)? {
            "b64_json" => {}
            "url" => {
                return Err(ApiError::bad(
                    "response_format",
                    "unsupported_value",
                    "response_format `url` is not served: moss keeps no files; ask for `b64_json`",
                ))
            }
            f => return Err(ApiError::bad("response_format", "invalid_value", format!("response_format `{f}`: use `b64_json`"))),
        }
    }
    if let Some(v) = get("output_format") {
        g.format = match string("output_format", v)? {
            "png" => "png",
            "jpeg" | "jpg" => "jpeg",
            "webp" => "webp",
            f => return Err(ApiError::bad("output_format", "invalid_value", format!("output_format `{f}`: use `png`, `jpeg` or `webp`"))),
        };
    }
    let compression = match get("output_compression") {
        Some(v) => {
            let c = whole("output_compression", v)?;
            if c > 100 {
                return Err(ApiError::bad("output_compression", "invalid_value", format!("`output_compression` must be in 0..=100, got {c}")));
            }
            Some(c)
        }
        None => None,
    };
    // The picture is encoded as `moss generate -o picture.EXT [--quality Q]` encodes it: a JPEG's
    // quality is `output_compression` (0 as 1, the lowest JPEG quality); PNG and WebP are
    // lossless, their compression changes nothing.
    g.req.out = match g.format {
        "jpeg" => "picture.jpg".into(),
        "webp" => "picture.webp".into(),
        _ => Default::default(),
    };
    if g.format == "jpeg" {
        g.req.quality = Some(compression.unwrap_or(DEFAULT_COMPRESSION).max(1) as u8);
    }
    if let Some(v) = get("negative_prompt") {
        g.req.spec.negative = string("negative_prompt", v)?.to_string();
    }
    if let Some(v) = get("seed") {
        g.req.spec.seed = v.as_u64().ok_or_else(|| ApiError::bad("seed", "invalid_type", format!("`seed` must be a whole number in 0..2^64, got {v}")))?;
    }
    if let Some(v) = get("num_inference_steps") {
        let s = whole("num_inference_steps", v)?;
        if !(1..=lim.max_steps as u64).contains(&s) {
            return Err(ApiError::bad(
                "num_inference_steps",
                "invalid_value",
                format!("`num_inference_steps` must be in 1..={} (--max-steps), got {s}", lim.max_steps),
            ));
        }
        g.req.spec.steps = s as u32;
    }
    if let Some(v) = get("guidance_scale") {
        let x = v.as_f64().ok_or_else(|| ApiError::bad("guidance_scale", "invalid_type", format!("`guidance_scale` must be a number, got {v}")))?;
        if !(x as f32).is_finite() {
            return Err(ApiError::bad("guidance_scale", "invalid_value", format!("`guidance_scale` {x} is not a finite number")));
        }
        g.req.spec.guidance = x as f32;
    }
    if let Some(v) = get("stream") {
        g.stream = v.as_bool().ok_or_else(|| ApiError::bad("stream", "invalid_type", format!("`stream` must be true or false, got {v}")))?;
    }
    if let Some(v) = get("partial_images") {
        g.partial_images = partial_images(whole("partial_images", v)?, g.stream, lim)?;
    }
    super::loop_fields::parse(&mut g.req.spec, &get, lim)?;
    // Last: a request that leaves `size` out gets the default size, and its other errors first.
    let pixels = g.req.spec.width as u64 * g.req.spec.height as u64;
    if pixels > lim.max_pixels {
        return Err(ApiError::bad(
            "size",
            "invalid_value",
            format!("size {}x{} is above this server's limit of {} pixels (--max-size)", g.req.spec.width, g.req.spec.height, lim.max_pixels),
        ));
    }
    Ok(g)
}

/// `partial_images`: 0..=3, streamed only (`stream: true`), and only where the VAE stays loaded.
fn partial_images(k: u64, stream: bool, lim: &Limits) -> Result<usize, ApiError> {
    if k > MAX_PARTIAL_IMAGES {
        return Err(ApiError::bad("partial_images", "invalid_value", format!("`partial_images` must be in 0..={MAX_PARTIAL_IMAGES}, got {k}")));
    }
    if k > 0 && !stream {
        return Err(ApiError::bad("partial_images", "invalid_value", "`partial_images` streams: give `stream: true` (or 0)"));
    }
    if k > 0 && !lim.previews {
        return Err(ApiError::bad(
            "partial_images",
            "unsupported_value",
            "`partial_images`: this server's memory plan does not keep the VAE loaded beside the transformer, so it sends no partial images; use 0",
        ));
    }
    Ok(k as usize)
}

/// The DiT's joint tokens (`W/16 * H/16` + `text`) must fit in `budget` (what the GPU holds next
/// to the resident weights); else a 400 naming the largest square size that fits.
pub fn check_fits(budget: usize, w: u32, h: u32, text: usize) -> Result<(), ApiError> {
    let image = (w / 16) as usize * (h / 16) as usize;
    if image.saturating_add(text) <= budget {
        return Ok(());
    }
    let side = ((budget.saturating_sub(text) as f64).sqrt() as usize).min(crate::options::MAX_SIDE as usize / 16) * 16;
    let largest = if side == 0 { "no size fits with this prompt".to_string() } else { format!("the largest square size that fits is {side}x{side}") };
    Err(ApiError::bad(
        "size",
        "size_does_not_fit",
        format!("size {w}x{h} with {text} prompt tokens does not fit in the GPU memory left next to the resident weights; {largest}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits { max_steps: 100, max_pixels: 1024 * 1024, max_tokens: 4096, dit_blocks: 4, previews: true, devices: 1 }
    }

    #[test]
    fn fields_and_defaults() {
        let base = base_request(vec![22], (0.0, 1.0), 4096, Precision::Bf16);
        let g = parse(
            br#"{"prompt":"a cat","seed":7,"n":3,"size":"64x32","num_inference_steps":4,"guidance_scale":1,"quality":"hd","user":"u"}"#,
            &lim(),
            &["m"],
            &base,
            1,
        )
        .unwrap();
        assert_eq!((g.req.spec.seed, g.n, g.req.spec.width, g.req.spec.height, g.req.spec.steps, g.req.spec.guidance), (7, 3, 64, 32, 4, 1.0));
        let g = parse(br#"{"prompt":"a cat","size":"auto","model":"m","seed":null}"#, &lim(), &["m"], &base, 99).unwrap();
        assert_eq!((g.req.spec.seed, g.req.spec.width, g.req.spec.steps, g.req.spec.guidance, g.n, g.stream), (99, 1024, 50, 3.0, 1, false));
        // An alias names the same model; jpeg with a compression is `-o x.jpg --quality N`.
        let g =
            parse(br#"{"prompt":"a cat","model":"dall-e-3","output_format":"jpeg","output_compression":55}"#, &lim(), &["m", "dall-e-3"], &base, 1).unwrap();
        assert_eq!((g.format, g.req.out.to_str(), g.req.quality), ("jpeg", Some("picture.jpg"), Some(55)));
        let g = parse(br#"{"prompt":"a cat","output_format":"jpeg","output_compression":0}"#, &lim(), &["m"], &base, 1).unwrap();
        assert_eq!(g.req.quality, Some(1));
        let g = parse(br#"{"prompt":"a cat","output_format":"jpeg"}"#, &lim(), &["m"], &base, 1).unwrap();
        assert_eq!(g.req.quality, Some(100), "OpenAI's default");
        let g = parse(br#"{"prompt":"a cat","output_format":"webp","output_compression":50}"#, &lim(), &["m"], &base, 1).unwrap();
        assert_eq!((g.format, g.req.out.to_str(), g.req.quality), ("webp", Some("picture.webp"), None));
    }

    #[test]
    fn sizes_past_the_memory_plan_name_the_largest_that_fits() {
        assert!(check_fits(usize::MAX, 4096, 4096, 4096).is_ok());
        assert!(check_fits(64 * 64 + 100, 1024, 1024, 100).is_ok(), "exactly the budget fits");
        let e = check_fits(64 * 64 + 99, 1024, 1024, 100).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref(), e.code), (400, Some("size"), "size_does_not_fit"));
        assert!(e.message.contains("largest square size that fits is 1008x1008"), "{}", e.message);
        assert!(check_fits(50, 64, 64, 60).unwrap_err().message.contains("no size fits"));
    }

    #[test]
    fn refusals_name_the_field() {
        let cases: [(&[u8], u16, &str); 18] = [
            (b"{", 400, ""),
            (b"[1]", 400, ""),
            (br#"{"n":1}"#, 400, "prompt"),
            (br#"{"prompt":"x","sede":1}"#, 400, "sede"),
            (br#"{"prompt":"x","n":9}"#, 400, "n"),
            (br#"{"prompt":"x","n":0}"#, 400, "n"),
            (br#"{"prompt":"x","size":"100x64"}"#, 400, "size"),
            (br#"{"prompt":"x","size":"2048x2048"}"#, 400, "size"),
            (br#"{"prompt":"x","response_format":"url"}"#, 400, "response_format"),
            (br#"{"prompt":"x","output_format":"gif"}"#, 400, "output_format"),
            (br#"{"prompt":"x","output_compression":101}"#, 400, "output_compression"),
            (br#"{"prompt":"   "}"#, 400, "prompt"),
            (br#"{"prompt":"x","seed":-1}"#, 400, "seed"),
            (br#"{"prompt":"x","num_inference_steps":101}"#, 400, "num_inference_steps"),
            (br#"{"prompt":"x","guidance_scale":"3"}"#, 400, "guidance_scale"),
            (br#"{"prompt":"x","guidance_scale":1e300}"#, 400, "guidance_scale"),
            (br#"{"prompt":"x","stream":"yes"}"#, 400, "stream"),
            (br#"{"prompt":"x","model":"other"}"#, 404, "model"),
        ];
        for (body, status, param) in cases {
            let e = parse(body, &lim(), &["m"], &base_request(vec![], (0.0, 1.0), 4096, Precision::Bf16), 0).unwrap_err();
            assert_eq!(e.status.as_u16(), status, "{}: {e:?}", String::from_utf8_lossy(body));
            assert_eq!(e.param.as_deref().unwrap_or(""), param, "{e:?}");
            if !param.is_empty() {
                assert!(e.message.contains(param), "{e:?}");
            }
        }
    }
}
