//! The routes: `POST /v1/images/generations` (JSON or server-sent events), `GET /v1/models`,
//! `GET /health` (readiness), `GET /livez` (liveness), `GET /metrics`; the API key check, the
//! error envelope for every error, and one log line per request.

use super::api::{self, ApiError, Generation, Limits};
use super::guard;
use super::queue::{Event, Job, Queue};
use crate::prompt::PromptTokenizer;
use axum::body::Bytes;
use axum::extract::multipart::{Multipart, MultipartRejection};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;
use tower_http::limit::RequestBodyLimitLayer;

pub struct AppState {
    pub queue: Arc<Queue>,
    pub tokenizer: PromptTokenizer,
    /// The served model's id (its repo id or folder name, never a path), then its aliases
    /// (`--served-model-name`): `GET /v1/models` lists them, a request's `model` may be any, or
    /// `--model` as given.
    pub models: Vec<String>,
    /// `--model` as given.
    pub model_spec: String,
    pub limits: Limits,
    /// What a request's fields are written over ([`api::base_request`]).
    pub base: crate::pipeline::Request,
    pub api_key: Option<String>,
    /// The memory plan, as `/health` shows it.
    pub plan: Value,
    pub max_body: usize,
    /// The edits route's body limit (`--max-upload`).
    pub max_upload: usize,
    pub next_id: AtomicU64,
    pub started: u64,
    /// The adapters requests may name (`--lora-dir`).
    pub loras: Arc<super::loras::Registry>,
}

/// An accepted generation logs its own line when it ends ([`Guard`]).
#[derive(Clone, Copy)]
struct LogsItself;

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The routes under their layers, outermost first: [`observe`] (the envelope, the count, the log
/// line), the Host and Origin checks ([`guard::check`]), CORS for the allowed origins, the body's
/// time and size limits; then per route the API key and, for JSON routes, the content type.
pub fn router(st: Arc<AppState>, body_timeout: Duration, g: guard::Guard) -> Router {
    let v1 = Router::new()
        .merge(
            Router::new()
                .route("/v1/images/generations", post(generations).route_layer(middleware::from_fn(guard::json_only)))
                .layer(RequestBodyLimitLayer::new(st.max_body)),
        )
        .merge(
            Router::new()
                .route(EDITS, post(edits).route_layer(middleware::from_fn(guard::multipart_only)))
                .layer(RequestBodyLimitLayer::new(st.max_upload))
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/v1/models", get(models))
        .route("/v1/loras", get(loras))
        .route_layer(middleware::from_fn_with_state(st.clone(), authorize));
    let mut r = Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics))
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(body_timeout));
    if let Some(cors) = g.cors() {
        r = r.layer(cors);
    }
    r.layer(middleware::from_fn_with_state(Arc::new(g), guard::check)).layer(middleware::from_fn_with_state(st.clone(), observe)).with_state(st)
}

/// `Authorization: Bearer KEY`, compared in constant time, when the server has a key.
async fn authorize(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let ok = given.is_some_and(|g| bool::from(g.trim().as_bytes().ct_eq(key.as_bytes())));
        if !ok {
            let what = if given.is_some() { "the API key is wrong" } else { "no API key: send `Authorization: Bearer KEY`" };
            return ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", what).into_response();
        }
    }
    next.run(req).await
}

/// Every response: a bare error status (unknown route, body too large or too slow, wrong method)
/// gets the OpenAI envelope; the status is counted; one line is logged.
async fn observe(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let mut res = next.run(req).await;
    let status = res.status();
    let is_json = res.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if status.as_u16() >= 400 && !is_json && path != "/health" {
        let msg = match status {
            StatusCode::NOT_FOUND => {
                format!(
                    "no route {method} {path} (routes: POST /v1/images/generations, /v1/images/edits, GET /v1/models, /v1/loras, /health, /livez, /metrics)"
                )
            }
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "the body must be JSON (Content-Type: application/json)".into(),
            StatusCode::PAYLOAD_TOO_LARGE if path == EDITS => {
                format!("the request body is above this server's limit of {} bytes for edits (--max-upload)", st.max_upload)
            }
            StatusCode::PAYLOAD_TOO_LARGE => format!("the request body is above this server's limit of {} bytes (--max-body)", st.max_body),
            StatusCode::METHOD_NOT_ALLOWED => format!("{method} is not allowed on {path}"),
            StatusCode::REQUEST_TIMEOUT => "the request body did not arrive in time".into(),
            _ => format!("the request could not be read ({status})"),
        };
        let code = match status {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            _ => "invalid_request",
        };
        res = ApiError::new(status, code, msg).into_response();
    }
    st.queue.metrics.with(|c| *c.requests.entry(status.as_u16()).or_default() += 1);
    if res.extensions().get::<LogsItself>().is_none() {
        log_request(method.as_str(), &path, status.as_u16(), t0, None);
    }
    res
}

fn log_request(method: &str, path: &str, status: u16, t0: Instant, seed: Option<u64>) {
    let seed = seed.map_or("-".to_string(), |s| s.to_string());
    super::log(&format!("{method} {path} {status} {:.3}s seed={seed}", t0.elapsed().as_secs_f64()));
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let (code, status) = if st.queue.draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    } else if st.queue.ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    };
    (code, Json(json!({"status": status, "model": st.models[0], "memory_plan": st.plan}))).into_response()
}

/// Liveness: 200 whenever the process answers (while the weights load, a picture renders or the
/// queue drains); it reads no state the engine holds.
async fn livez() -> Response {
    (StatusCode::OK, Json(json!({"status": "alive"}))).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = st.models.iter().map(|id| json!({"id": id, "object": "model", "created": st.started, "owned_by": "moss"})).collect();
    Json(json!({"object": "list", "data": data}))
}

async fn loras(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(st.loras.list())
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let page = super::metrics::render(&st.queue.metrics.snapshot(), &st.queue.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], page).into_response()
}

/// Cancels its job when dropped before the job finished (the client went away), and writes the
/// request's log line: the status it ended with, or 499 when the client left first.
struct Guard {
    queue: Arc<Queue>,
    job: Arc<Job>,
    /// Set when the answer is complete (200) or an error was sent.
    status: Option<u16>,
    t0: Instant,
    /// A stream's 200 was counted when it started: a client leaving it is not a second response.
    counted: bool,
    /// The route, for the log line.
    path: &'static str,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.status.is_none() {
            if self.queue.cancel(&self.job) {
                super::log(&format!("request {}: the client went away; removed from the queue", self.job.id));
            }
            if !self.counted {
                self.queue.metrics.with(|c| *c.requests.entry(499).or_default() += 1);
            }
        }
        log_request("POST", self.path, self.status.unwrap_or(499), self.t0, Some(self.job.gen.req.spec.seed));
    }
}

/// Token ids of the texts the picture encodes ([`crate::pipeline::prompt_texts`]: the prompt,
/// and the negative unless guidance is exactly 1), refused past the token limit.
fn tokenize(st: &AppState, g: &Generation) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut out = vec![];
    for (i, t) in crate::pipeline::prompt_texts(&g.req).into_iter().enumerate() {
        let param = if i == 0 { "prompt" } else { "negative_prompt" };
        let tk = st.tokenizer.encode(t, st.limits.max_tokens).map_err(|e| ApiError::internal(format!("{e:#}")))?;
        if let Some(n) = tk.truncated_from {
            return Err(ApiError::bad(
                param,
                "invalid_value",
                format!("`{param}` is {n} tokens; this server takes at most {} (--max-tokens)", st.limits.max_tokens),
            ));
        }
        out.push(tk.ids);
    }
    Ok(out)
}

/// The memory plan's verdict ([`api::check_fits`]), once the engine is loaded.
fn check_fits(st: &AppState, g: &Generation, tokens: &[Vec<u32>]) -> Result<(), ApiError> {
    if !st.queue.ready() {
        return Ok(());
    }
    let text = tokens.iter().map(Vec::len).max().unwrap_or(0);
    api::check_fits(st.queue.joint_tokens(), g.req.spec.width, g.req.spec.height, text)
}

async fn generations(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(&st, start(&st, &body), "/v1/images/generations").await
}

/// The answer to a queued generation (plain or streamed), or its refusal.
async fn answer(st: &AppState, started: Result<Started, ApiError>, path: &'static str) -> Response {
    match started {
        Ok((g, job, rx, ahead)) => {
            let guard = Guard { queue: st.queue.clone(), job, status: None, t0: Instant::now(), counted: g.stream, path };
            let mut res = if g.stream { stream(guard, rx, ahead) } else { collect(guard, rx).await };
            res.extensions_mut().insert(LogsItself);
            res
        }
        Err(e) => e.into_response(),
    }
}

type Started = (Generation, Arc<Job>, mpsc::UnboundedReceiver<Event>, usize);

/// The seed of a request that sets none.
fn random_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0) ^ (std::process::id() as u64) << 32
}

fn start(st: &AppState, body: &[u8]) -> Result<Started, ApiError> {
    let g = api::parse(body, &st.limits, &model_names(st), &st.base, random_seed())?;
    let loras = serde_json::from_slice::<Value>(body).ok();
    queue(st, g, loras.as_ref().and_then(|v| v.get("lora")))
}

/// The path of the edits route.
const EDITS: &str = "/v1/images/edits";

/// `POST /v1/images/edits` ([`super::edits`]): the form read, the pictures decoded and prepared
/// on a blocking thread, then queued and answered as a generation.
async fn edits(State(st): State<Arc<AppState>>, form: Result<Multipart, MultipartRejection>) -> Response {
    let form = match form {
        Ok(m) => super::edits::read(m).await,
        Err(e) => Err(ApiError::new(e.status(), "invalid_multipart", e.body_text())),
    };
    let form = match form {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let st2 = st.clone();
    let started = tokio::task::spawn_blocking(move || {
        let loras = form.fields.get("lora").cloned();
        let g = super::edits::parse(form, &st2.limits, &model_names(&st2), &st2.base, random_seed())?;
        queue(&st2, g, loras.as_ref())
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::internal(format!("the request's pictures could not be read: {e}"))));
    answer(&st, started, EDITS).await
}

/// The names the served model answers to: its ids and aliases, then its spec.
fn model_names(st: &AppState) -> Vec<&str> {
    let mut names: Vec<&str> = st.models.iter().map(String::as_str).collect();
    names.push(&st.model_spec);
    names
}

/// A checked generation into the queue (`lora`: the request's field).
fn queue(st: &AppState, g: Generation, lora: Option<&Value>) -> Result<Started, ApiError> {
    let loras = st.loras.choose(lora)?;
    let tokens = tokenize(st, &g)?;
    check_fits(st, &g, &tokens)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let id = st.next_id.fetch_add(1, Ordering::Relaxed);
    let job = Arc::new(Job { id, gen: g.clone(), tokens, tx, cancel: Default::default(), enqueued: Instant::now(), loras });
    let ahead = st.queue.push(job.clone())?;
    Ok((g, job, rx, ahead))
}

fn item(index: usize, seed: u64, p: &super::engine::Picture, queued_s: f64) -> Value {
    json!({
        "index": index,
        "b64_json": base64::engine::general_purpose::STANDARD.encode(&p.bytes),
        "seed": seed,
        "timings": {"queued_s": queued_s, "lora_switch_s": p.lora_switch_s, "encode_s": p.encode_s, "denoise_s": p.denoise_s, "decode_s": p.decode_s, "total_s": p.total_s},
        "forwards": p.forwards,
    })
}

/// The fields OpenAI's image stream events carry beside the image (`ImageGenPartialImageEvent`,
/// `ImageGenCompletedEvent`): moss's pictures are opaque and it has no quality setting.
fn openai_event_fields(v: &mut Value, size: &str, format: &str) {
    v["created_at"] = json!(now_s());
    v["background"] = json!("opaque");
    v["output_format"] = json!(format);
    v["quality"] = json!("auto");
    v["size"] = json!(size);
}

/// The plain answer: every picture, or the first error.
async fn collect(mut guard: Guard, mut rx: mpsc::UnboundedReceiver<Event>) -> Response {
    let g = guard.job.gen.clone();
    let mut data = vec![];
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Image { index, seed, picture, queued_s } => data.push(item(index, seed, &picture, queued_s)),
            Event::Failed(e) => {
                guard.status = Some(e.status.as_u16());
                return e.into_response();
            }
            Event::Done => break,
            Event::Queued { .. } | Event::Step { .. } | Event::Partial { .. } => {}
        }
    }
    if data.len() != g.n as usize {
        let e = ApiError::unavailable("the server stopped before the pictures were done");
        guard.status = Some(e.status.as_u16());
        return e.into_response();
    }
    guard.status = Some(200);
    let size = format!("{}x{}", g.req.spec.width, g.req.spec.height);
    Json(json!({"created": now_s(), "data": data, "output_format": g.format, "size": size})).into_response()
}

fn sse(kind: &str, mut v: Value) -> Result<SseEvent, std::convert::Infallible> {
    v["type"] = json!(kind);
    Ok(SseEvent::default().event(kind).data(v.to_string()))
}

/// `"stream": true`: `image_generation.queued` (requests ahead), `image_generation.step`, with
/// `partial_images` OpenAI's `image_generation.partial_image` (`partial_image_index` from 0 per
/// picture, `index` the picture), one `image_generation.completed` per picture, then `done` (or
/// one `error`).
fn stream(guard: Guard, rx: mpsc::UnboundedReceiver<Event>, ahead: usize) -> Response {
    let first = sse("image_generation.queued", json!({"position": ahead}));
    let rest = futures_util::stream::unfold(Some((guard, rx)), |state| async move {
        let (mut guard, mut rx) = state?;
        let spec = &guard.job.gen.req.spec;
        let size = format!("{}x{}", spec.width, spec.height);
        let ev = match rx.recv().await {
            Some(ev) => ev,
            None => return None,
        };
        let out = match ev {
            Event::Queued { ahead } => sse("image_generation.queued", json!({"position": ahead})),
            Event::Step { index, step, steps } => sse("image_generation.step", json!({"index": index, "step": step, "steps": steps})),
            Event::Partial { index, partial, step, steps, png } => {
                let mut v = json!({
                    "index": index,
                    "partial_image_index": partial,
                    "b64_json": base64::engine::general_purpose::STANDARD.encode(&png),
                    "step": step,
                    "steps": steps,
                });
                openai_event_fields(&mut v, &size, guard.job.gen.format);
                sse("image_generation.partial_image", v)
            }
            Event::Image { index, seed, picture, queued_s } => {
                let mut v = item(index, seed, &picture, queued_s);
                v["created"] = json!(now_s());
                openai_event_fields(&mut v, &size, guard.job.gen.format);
                sse("image_generation.completed", v)
            }
            Event::Failed(e) => {
                guard.status = Some(e.status.as_u16());
                let out = sse("error", e.body());
                return Some((out, None));
            }
            Event::Done => {
                guard.status = Some(200);
                return Some((sse("done", json!({})), None));
            }
        };
        Some((out, Some((guard, rx))))
    });
    let body = futures_util::StreamExt::boxed(futures_util::stream::StreamExt::chain(futures_util::stream::iter([first]), rest));
    let mut res = Sse::new(body).keep_alive(axum::response::sse::KeepAlive::default()).into_response();
    res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}
