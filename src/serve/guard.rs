//! What keeps a web page from driving the server through the user's browser, as local servers
//! such as Jupyter and Ollama do:
//!
//! - **Origin.** A request with an `Origin` header (a browser sends one with every cross-origin
//!   call and every POST) is refused (403, `origin_not_allowed`) unless `--allow-origin` names that
//!   origin; allowed origins get CORS answers (preflight included), so a web app there can call
//!   the API.
//! - **Host.** On a loopback bind without an API key, only loopback host names are answered
//!   (`localhost`, `127.0.0.1` and the rest of 127/8, `[::1]`, any port): a page whose name was
//!   made to resolve to 127.0.0.1 (DNS rebinding) sends its own name, and is refused (403,
//!   `host_not_allowed`), as is an HTTP/1.1 request without a Host. An HTTP/1.0 request may come
//!   without one (HAProxy's `option httpchk`, other health checks) and is answered: no browser
//!   sends it. With a key, or on another address, the key is what guards.
//! - **JSON only.** The JSON routes take `Content-Type: application/json` only (415,
//!   `unsupported_media_type`): a page's plain form or `text/plain` post is no request. The
//!   edits route takes `multipart/form-data` only; a page's form post carries an `Origin`.

use super::api::ApiError;
use anyhow::{bail, Result};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;

/// The origins and host names a server answers.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    /// Allowed origins, as browsers write them (`http://localhost:3000`), lower case.
    pub origins: Vec<String>,
    /// Answer loopback host names only.
    pub loopback_hosts_only: bool,
}

/// An `--allow-origin` value as a browser writes the origin: `scheme://host[:port]`, lower case,
/// no path; anything else is refused.
pub fn origin(s: &str) -> Result<String> {
    let uri: Uri = s.parse().map_err(|_| anyhow::anyhow!("--allow-origin {s:?} is not an origin such as http://localhost:3000"))?;
    let path_ok = matches!(uri.path_and_query().map(|p| p.as_str()), None | Some("/") | Some(""));
    let (Some(scheme), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
        bail!("--allow-origin {s:?} is not an origin such as http://localhost:3000 (scheme://host[:port])");
    };
    if !path_ok || !matches!(scheme, "http" | "https") || auth.as_str().contains('@') {
        bail!("--allow-origin {s:?} is not an origin such as http://localhost:3000 (scheme://host[:port], no path)");
    }
    Ok(format!("{scheme}://{}", auth.as_str().to_ascii_lowercase()))
}

impl Guard {
    fn allows_origin(&self, o: &HeaderValue) -> bool {
        o.to_str().is_ok_and(|o| self.origins.iter().any(|a| a.eq_ignore_ascii_case(o.trim_end_matches('/'))))
    }

    /// CORS for the allowed origins (none: no CORS layer at all).
    pub fn cors(&self) -> Option<tower_http::cors::CorsLayer> {
        use tower_http::cors::{AllowOrigin, CorsLayer};
        if self.origins.is_empty() {
            return None;
        }
        let list: Vec<HeaderValue> = self.origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
        Some(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(list))
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]),
        )
    }
}

/// Whether `host` (a `Host` header or a URI's authority: a name, an address, `[v6]`, a port) names
/// this machine's loopback interface.
pub fn is_loopback_host(host: &str) -> bool {
    let Ok(auth) = host.parse::<axum::http::uri::Authority>() else { return false };
    let name = auth.host();
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The Host and Origin checks, before anything else a request meets.
pub async fn check(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    if g.loopback_hosts_only {
        let host =
            req.uri().authority().map(|a| a.as_str().to_string()).or_else(|| req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string));
        // HTTP/1.0 allows no Host (a load balancer's health check sends none); no browser sends that.
        let http10_without_host = host.is_none() && req.version() <= Version::HTTP_10;
        if !http10_without_host && !host.as_deref().is_some_and(is_loopback_host) {
            let named = host.map_or("no Host".to_string(), |h| format!("Host {:?}", h));
            let msg = format!(
                "{named} is not this machine's loopback name: a server on 127.0.0.1 without an API key answers \
                 localhost, 127.0.0.1 and [::1] only (set --api-key to serve other names)"
            );
            return ApiError::new(StatusCode::FORBIDDEN, "host_not_allowed", msg).into_response();
        }
    }
    if let Some(o) = req.headers().get(header::ORIGIN) {
        if !g.allows_origin(o) {
            let msg = format!(
                "requests from web pages are refused (Origin {:?}); start the server with --allow-origin ORIGIN to allow one",
                o.to_str().unwrap_or("?")
            );
            return ApiError::new(StatusCode::FORBIDDEN, "origin_not_allowed", msg).into_response();
        }
    }
    next.run(req).await
}

/// A JSON route: `Content-Type: application/json` (parameters such as `charset` allowed), else 415.
pub async fn json_only(req: Request, next: Next) -> Response {
    let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        let got = if ct.is_empty() { "no Content-Type".to_string() } else { format!("Content-Type {ct:?}") };
        let msg = format!("{} takes a JSON body with Content-Type: application/json, got {got}", req.uri().path());
        return ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", msg).into_response();
    }
    next.run(req).await
}

/// `POST /v1/images/edits` takes `multipart/form-data` only (415 otherwise). (A browser may send
/// a form cross-origin without asking first; the Origin check above refuses it.)
pub async fn multipart_only(req: Request, next: Next) -> Response {
    let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("multipart/form-data") {
        let got = if ct.is_empty() { "no Content-Type".to_string() } else { format!("Content-Type {ct:?}") };
        let msg = format!("{} takes a multipart/form-data body (the pictures as files), got {got}", req.uri().path());
        return ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", msg).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names() {
        for h in ["localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:1", "127.1.2.3:80", "[::1]", "[::1]:8000"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["evil.example", "evil.example:8000", "localhost.evil.example", "10.0.0.1", "[::2]:80", "", "127.0.0.1.nip.io"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn origins_as_browsers_write_them() {
        assert_eq!(origin("http://LocalHost:3000/").unwrap(), "http://localhost:3000");
        assert_eq!(origin("https://app.example").unwrap(), "https://app.example");
        for bad in ["*", "localhost:3000", "http://a.example/path", "ftp://a.example", "http://u@a.example"] {
            assert!(origin(bad).is_err(), "{bad}");
        }
    }
}
