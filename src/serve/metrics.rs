//! Counters for `GET /metrics` (Prometheus text format 0.0.4) and the measured speed the queue's
//! `Retry-After` estimate is made from.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

#[derive(Default, Debug, Clone)]
pub struct Counts {
    /// HTTP responses by status code.
    pub requests: BTreeMap<u16, u64>,
    pub pictures: u64,
    pub pictures_failed: u64,
    pub pictures_cancelled: u64,
    pub picture_seconds: f64,
    pub steps: u64,
    pub step_seconds: f64,
    /// Encode + decode seconds of the finished pictures (the part that does not scale with steps).
    pub overhead_seconds: f64,
    /// Changes of the transformer's LoRA set, and their seconds.
    pub lora_switches: u64,
    pub lora_switch_seconds: f64,
}

#[derive(Default)]
pub struct Metrics {
    c: Mutex<Counts>,
}

impl Metrics {
    pub fn with<T>(&self, f: impl FnOnce(&mut Counts) -> T) -> T {
        f(&mut self.c.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn snapshot(&self) -> Counts {
        self.with(|c| c.clone())
    }

    /// Estimated seconds for a picture of `steps` steps: the mean seconds per step times the
    /// steps plus the mean encode + decode time; 1 s a picture before anything was measured.
    pub fn picture_estimate_s(&self, steps: u32) -> f64 {
        self.with(
            |c| {
                if c.steps == 0 || c.pictures == 0 {
                    1.0
                } else {
                    c.step_seconds / c.steps as f64 * steps as f64 + c.overhead_seconds / c.pictures as f64
                }
            },
        )
    }
}

/// The gauges read from the queue when the page is made.
pub struct Gauges {
    pub ready: bool,
    pub queued_requests: usize,
    pub queued_pictures: usize,
    pub running: bool,
}

/// The metrics page.
pub fn render(c: &Counts, g: &Gauges) -> String {
    let mut s = String::new();
    // A summary's rows carry their suffix (`_sum`, `_count`) where other rows carry labels.
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(s, "{name}{labels} {v}");
        }
    };
    let one = |v: String| vec![(String::new(), v)];
    metric(
        "moss_requests_total",
        "counter",
        "HTTP responses by status code.",
        c.requests.iter().map(|(k, v)| (format!("{{status=\"{k}\"}}"), v.to_string())).collect(),
    );
    metric("moss_ready", "gauge", "1 once the weights are loaded.", one((g.ready as u8).to_string()));
    metric("moss_queue_depth", "gauge", "Requests waiting (not counting the running one).", one(g.queued_requests.to_string()));
    metric("moss_queue_pictures", "gauge", "Pictures the waiting requests ask for.", one(g.queued_pictures.to_string()));
    metric("moss_running", "gauge", "1 while a picture is being rendered.", one((g.running as u8).to_string()));
    metric("moss_pictures_total", "counter", "Pictures rendered.", one(c.pictures.to_string()));
    metric("moss_pictures_failed_total", "counter", "Pictures that failed (500).", one(c.pictures_failed.to_string()));
    metric("moss_pictures_cancelled_total", "counter", "Pictures stopped between steps (client gone or shutdown).", one(c.pictures_cancelled.to_string()));
    metric(
        "moss_picture_seconds",
        "summary",
        "Seconds per rendered picture (encode + denoise + decode).",
        vec![("_sum".into(), c.picture_seconds.to_string()), ("_count".into(), c.pictures.to_string())],
    );
    metric("moss_steps_total", "counter", "Denoising steps run (cancelled pictures included).", one(c.steps.to_string()));
    metric(
        "moss_step_seconds",
        "summary",
        "Seconds per denoising step.",
        vec![("_sum".into(), c.step_seconds.to_string()), ("_count".into(), c.steps.to_string())],
    );
    metric(
        "moss_lora_switch_seconds",
        "summary",
        "Seconds per change of the transformer's LoRA set (restore + merge).",
        vec![("_sum".into(), c.lora_switch_seconds.to_string()), ("_count".into(), c.lora_switches.to_string())],
    );
    s
}
