//! Progress on a terminal (indicatif bars), nothing otherwise: single pictures and batches.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use moss::batch;
use moss::pipeline::Progress;
use std::io::IsTerminal;

/// Progress bars on a terminal, nothing otherwise.
pub struct Bars {
    bar: Option<ProgressBar>,
    enabled: bool,
    quiet: bool,
    /// `-v`: the memory plan and the timings on stderr.
    pub verbose: bool,
}

impl Bars {
    pub fn new(quiet: bool) -> Bars {
        Bars { bar: None, enabled: !quiet && std::io::stderr().is_terminal(), quiet, verbose: false }
    }

    pub fn say(&self, line: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("moss: {line}")),
            None => eprintln!("moss: {line}"),
        }
    }
}

impl Progress for Bars {
    fn stage(&mut self, name: &str) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if !self.enabled {
            return;
        }
        if name == "denoise" {
            // Made as the loop starts, at step 0: the first step's rate is one step over its time.
            let b = ProgressBar::new(0);
            b.set_style(ProgressStyle::with_template("denoise {bar:30} {pos}/{len} steps  {per_sec}  eta {eta}").unwrap());
            self.bar = Some(b);
        } else {
            let b = ProgressBar::new_spinner();
            b.set_message(format!("{name}..."));
            b.enable_steady_tick(std::time::Duration::from_millis(120));
            self.bar = Some(b);
        }
    }
    fn step(&mut self, done: usize, total: usize) {
        if let Some(b) = &self.bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
    }
    fn warn(&mut self, msg: &str) {
        if !self.quiet {
            self.say(&format!("warning: {msg}"));
        }
    }
    fn plan(&mut self, line: &str) {
        if self.verbose {
            self.say(line);
        }
    }
}

impl Drop for Bars {
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Batch progress: one bar for the batch (its denoising steps, with the pictures written) and one
/// for the current picture, on a terminal only; results on stdout, errors on stderr.
pub struct BatchBars {
    multi: MultiProgress,
    batch: ProgressBar,
    pic: ProgressBar,
    pictures: usize,
    written: usize,
    stage: String,
    quiet: bool,
    json: bool,
}

impl BatchBars {
    pub fn new(quiet: bool, json: bool) -> BatchBars {
        let enabled = !quiet && std::io::stderr().is_terminal();
        let multi = MultiProgress::new();
        if !enabled {
            multi.set_draw_target(ProgressDrawTarget::hidden());
        }
        let batch = multi.add(ProgressBar::new(0));
        batch.set_style(ProgressStyle::with_template("batch   {bar:30} {msg}  {pos}/{len} steps  {per_sec}  eta {eta}").unwrap());
        let pic = multi.add(ProgressBar::new(0));
        BatchBars { multi, batch, pic, pictures: 0, written: 0, stage: String::new(), quiet, json }
    }

    pub fn say(&self, line: String) {
        self.multi.suspend(|| eprintln!("{line}"));
    }

    fn message(&self) {
        self.batch.set_message(format!("{}/{} pictures", self.written, self.pictures));
    }
}

impl batch::BatchProgress for BatchBars {
    fn begin(&mut self, pictures: usize, steps: u64) {
        self.pictures = pictures;
        self.batch.set_length(steps);
        self.batch.reset();
        self.message();
    }
    fn stage(&mut self, name: &str, chunk: usize, chunks: usize) {
        self.stage = if chunks > 1 { format!("{name} (chunk {}/{chunks})", chunk + 1) } else { name.to_string() };
        if name == "denoise" {
            self.pic.set_style(ProgressStyle::with_template("{prefix:7} {bar:30} {pos}/{len} steps  {per_sec}  eta {eta}").unwrap());
        } else {
            self.pic.set_style(ProgressStyle::with_template("{spinner} {msg}").unwrap());
            self.pic.enable_steady_tick(std::time::Duration::from_millis(120));
            self.pic.set_message(format!("{}...", self.stage));
        }
    }
    fn item(&mut self, job: &batch::Job, i: usize, n: usize) {
        self.pic.set_prefix(format!("line {}", job.item.line));
        self.pic.set_message(format!("{} {}/{n}: line {}", self.stage, i + 1, job.item.line));
        self.pic.set_length(job.item.spec.steps as u64);
        self.pic.reset();
    }
    fn step(&mut self, done: usize, total: usize) {
        self.pic.set_length(total as u64);
        self.pic.set_position(done as u64);
        self.batch.inc(1);
    }
    fn finished(&mut self, f: &batch::Finished) {
        self.written += 1;
        self.message();
        if self.json {
            self.multi.suspend(|| println!("{}", f.json()));
        } else if !self.quiet {
            self.multi.suspend(|| println!("{}", f.path.display()));
        }
    }
    fn failed(&mut self, msg: &str) {
        self.say(format!("moss: error: {msg}"));
    }
    fn warn(&mut self, msg: &str) {
        if !self.quiet {
            self.say(format!("moss: warning: {msg}"));
        }
    }
}

impl Drop for BatchBars {
    fn drop(&mut self) {
        self.pic.finish_and_clear();
        self.batch.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first step's rate is one step over the time it took (the bar starts with the loop).
    #[test]
    fn the_first_steps_rate_is_its_own() {
        let mut b = Bars { bar: None, enabled: true, quiet: false, verbose: false };
        b.stage("denoise");
        std::thread::sleep(std::time::Duration::from_millis(100));
        b.step(1, 10);
        let rate = b.bar.as_ref().unwrap().per_sec();
        assert!(rate > 0.0 && rate < 20.0, "{rate} steps/s after one step of 0.1 s");
    }
}
