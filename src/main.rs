
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use moss::batch;
use clap::{CommandFactory, FromArgMatches};
use moss::cli::{Cli, Command, GenerateArgs, PromptArgs, Seed};
use moss::pipeline::{self, Progress, Request};
use std::io::IsTerminal;
use std::process::ExitCode;

/// Progress bars on a terminal, nothing otherwise.
struct Bars {
    bar: Option<ProgressBar>,
    enabled: bool,
    quiet: bool,
    /// `-v`: the memory plan and the timings on stderr.
    verbose: bool,
}

impl Bars {
    fn new(quiet: bool) -> Bars {
        Bars { bar: None, enabled: !quiet && std::io::stderr().is_terminal(), quiet, verbose: false }
    }

    fn say(&self, line: &str) {
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
        if self.enabled && name != "denoise" {
            let b = ProgressBar::new_spinner();
            b.set_message(format!("{name}..."));
            b.enable_steady_tick(std::time::Duration::from_millis(120));
            self.bar = Some(b);
        }
    }
    fn step(&mut self, done: usize, total: usize) {
        if !self.enabled {
            return;
        }
        let b = self.bar.get_or_insert_with(|| {
            let b = ProgressBar::new(total as u64);
            b.set_style(
                ProgressStyle::with_template("denoise {bar:30} {pos}/{len} steps  {per_sec}  eta {eta}")
                    .unwrap(),
            );
            b
        });
        b.set_position(done as u64);
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
struct BatchBars {
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
    fn new(quiet: bool, json: bool) -> BatchBars {
        let enabled = !quiet && std::io::stderr().is_terminal();
        let multi = MultiProgress::new();
        if !enabled {
            multi.set_draw_target(ProgressDrawTarget::hidden());
        }
        let batch = multi.add(ProgressBar::new(0));
        batch.set_style(
            ProgressStyle::with_template("batch   {bar:30} {msg}  {pos}/{len} steps  {per_sec}  eta {eta}").unwrap(),
        );
        let pic = multi.add(ProgressBar::new(0));
        BatchBars { multi, batch, pic, pictures: 0, written: 0, stage: String::new(), quiet, json }
    }

    fn say(&self, line: String) {
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
            self.pic.set_style(
                ProgressStyle::with_template("{prefix:7} {bar:30} {pos}/{len} steps  {per_sec}  eta {eta}").unwrap(),
            );
        } else {
            self.pic.set_style(ProgressStyle::with_template("{spinner} {msg}").unwrap());
            self.pic.enable_steady_tick(std::time::Duration::from_millis(120));
            self.pic.set_message(format!("{}...", self.stage));
        }
    }
    fn item(&mut self, job: &batch::Job, i: usize, n: usize) {
        self.pic.set_prefix(format!("line {}", job.item.line));
        self.pic.set_message(format!("{} {}/{n}: line {}", self.stage, i + 1, job.item.line));
        self.pic.set_length(job.item.steps as u64);
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

/// `moss generate --prompts`: exit 0 if every item of this shard was written (or skipped), 1 if
/// any failed, 128 + the signal if stopped.
fn run_batch(a: &GenerateArgs, prompts: &std::path::Path) -> anyhow::Result<u8> {
    let seed = a.seed.resolve();
    if a.seed == Seed::Random && !a.quiet {
        eprintln!("moss: seed {seed} (random; item i uses {seed} + i)");
    }
    let o = batch::BatchOptions {
        prompts: prompts.to_path_buf(),
        loras: a.lora.clone(),
        defaults: batch::Defaults {
            negative: a.prompt.negative.clone(),
            seed,
            steps: a.steps,
            guidance: a.guidance,
            size: a.size,
        },
        out_dir: a.batch.out_dir.clone().unwrap_or_else(|| ".".into()),
        name: a.batch.name.clone().unwrap_or_else(|| batch::DEFAULT_NAME.to_string()),
        skip_existing: a.batch.skip_existing,
        allow_absolute_out: a.batch.allow_absolute_out,
        shard: a.batch.shard.unwrap_or_default(),
        chunk: a.batch.chunk.map(|c| c.min(usize::MAX as u64) as usize),
        uncond_skip: a.uncond_skip.0.clone(),
        skip_window: a.skip_window,
        max_tokens: a.prompt.max_tokens as usize,
        model: a.model.model.clone(),
        device: a.model.device,
        precision: a.precision,
        quality: a.quality,
        memory: pipeline::MemoryOptions { max_vram_gib: a.max_vram },
        other_inputs: [("the --from picture", &a.from), ("the prompt file", &a.prompt.prompt_file)]
            .into_iter()
            .filter_map(|(w, p)| Some((w, p.clone()?)))
            .collect(),
    };
    batch::install_stop_handler();
    let terminal = std::io::stderr().is_terminal();
    let mut bars = BatchBars::new(a.quiet, a.json);
    let s = batch::run(&o, &mut bars)?;
    drop(bars);
    let mut parts = vec![format!("{} written", s.written)];
    if s.skipped > 0 {
        parts.push(format!("{} skipped (already there)", s.skipped));
    }
    if s.failed > 0 {
        parts.push(format!("{} failed", s.failed));
    }
    if s.elsewhere > 0 {
        parts.push(format!("{} in other shards", s.elsewhere));
    }
    if let Some(sig) = s.stopped_by {
        eprintln!("moss: stopped by signal {sig}: {}; rerun with --skip-existing to go on", parts.join(", "));
        return Ok(128 + sig.clamp(1, 127) as u8);
    }
    if s.failed > 0 {
        eprintln!("moss: error: {}", parts.join(", "));
        return Ok(1);
    }
    if s.written == 0 && !a.quiet {
        // Said even off a terminal: an empty list, or nothing left to do, is worth one line.
        let why = if s.skipped + s.elsewhere == 0 { "the list has no items".to_string() } else { parts[1..].join(", ") };
        eprintln!("moss: nothing rendered: {why}");
    } else if terminal && !a.quiet {
        eprintln!("moss: {}", parts.join(", "));
    }
    Ok(0)
}

fn prompt_text(p: &PromptArgs) -> anyhow::Result<Option<String>> {
    match (&p.prompt, &p.prompt_file) {
        (Some(t), _) => Ok(Some(t.clone())),
        (None, Some(f)) => Ok(Some(moss::prompt::read_prompt_file(f)?)),
        (None, None) => Ok(None),
    }
}

/// `--count N`, `--seeds A,B,..` or an `-o` name template (`fox-{seed}.png`): the pictures of one
/// prompt as the items of a batch (one load, the same pictures batch mode gives), listed in a
/// temporary prompts file; `-o` is the batch's name template in its folder.
fn run_several(a: &GenerateArgs, prompt: String) -> anyhow::Result<u8> {
    if a.embeds.is_some() || a.save_latents.is_some() {
        anyhow::bail!("--count, --seeds and a `{{...}}` name in -o render through batch mode: not with --embeds or --save-latents");
    }
    moss::picture::check(&a.out, a.quality)?; // said of -o, not of the batch's --name
    let base = a.seed.resolve();
    if a.seed == Seed::Random && !a.quiet {
        eprintln!("moss: seed {base} (random; picture i uses {base} + i)");
    }
    let seeds: Vec<u64> = match &a.seeds {
        Some(list) => list.clone(),
        None => (0..a.count.unwrap_or(1)).map(|i| base.wrapping_add(i)).collect(),
    };
    let lines: Vec<String> = seeds.iter().map(|s| serde_json::json!({"prompt": prompt, "seed": s}).to_string()).collect();
    let list = std::env::temp_dir().join(format!("moss-seeds-{}.jsonl", std::process::id()));
    std::fs::write(&list, lines.join("\n") + "\n").map_err(|e| anyhow::anyhow!("cannot write {}: {e}", list.display()))?;
    let name = a.out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let name = if name.contains('{') || seeds.len() < 2 {
        name
    } else {
        // Several pictures and no template: moss.png -> moss-{seed}.png.
        let p = std::path::Path::new(&name);
        let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        match p.extension() {
            Some(e) => format!("{stem}-{{seed}}.{}", e.to_string_lossy()),
            None => format!("{stem}-{{seed}}"),
        }
    };
    let mut b = a.clone();
    b.seed = Seed::Fixed(base);
    b.batch.out_dir = Some(match a.out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => ".".into(),
    });
    b.batch.name = Some(name);
    let r = run_batch(&b, &list);
    let _ = std::fs::remove_file(&list);
    r
}

/// `--from PIC`: the picture's recorded settings, where no flag on the command line overrides them.
fn apply_from(a: &mut GenerateArgs, pic: &std::path::Path, given: &dyn Fn(&str) -> bool) -> anyhow::Result<()> {
    let p = read_settings(pic)?;
    if a.prompt.prompt.is_none() && a.prompt.prompt_file.is_none() {
        a.prompt.prompt = Some(p.prompt);
    }
    if !given("negative") {
        a.prompt.negative = p.negative;
    }
    if !given("seed") {
        a.seed = Seed::Fixed(p.seed);
    }
    if !given("steps") {
        a.steps = p.steps;
    }
    if !given("guidance") {
        a.guidance = p.guidance;
    }
    if !given("size") {
        a.size = moss::options::parse_size(&format!("{}x{}", p.width, p.height)).map_err(anyhow::Error::msg)?;
    }
    if !given("uncond_skip") {
        a.uncond_skip = moss::cli::SkipList(p.uncond_skip);
    }
    if !given("skip_window") {
        a.skip_window = p.skip_window;
    }
    if !given("max_tokens") {
        a.prompt.max_tokens = p.max_tokens.clamp(1, 4096) as u32;
    }
    if !given("precision") {
        a.precision = p.precision.parse().map_err(anyhow::Error::msg)?;
    }
    if !given("device") {
        a.model.device = p.device.parse().map_err(anyhow::Error::msg)?;
    }
    if !given("model") {
        a.model.model = p.model;
    }
    Ok(())
}

/// The settings recorded in a moss picture.
fn read_settings(pic: &std::path::Path) -> anyhow::Result<moss::metadata::Params> {
    use anyhow::Context;
    let meta = moss::picture_in::read_metadata(pic)?;
    moss::metadata::Params::from_png(&meta).with_context(|| pic.display().to_string())
}

/// A warning for `--uncond-skip` indices the user gave past the model's last block (not for the
/// default 22, which a small checkpoint may not reach). A checkpoint that does not open is the
/// run's own error, said there.
fn warn_skips_beyond(skip: &[usize], model: &str, quiet: bool) {
    if quiet {
        return;
    }
    if let Some(w) = pipeline::open_checkpoint(model).ok().and_then(|ck| pipeline::skips_beyond(skip, &ck)) {
        eprintln!("moss: warning: {w}");
    }
}

/// The exit code: 0 on success, 1 when something failed. `given(id)`: whether the flag with
/// that id was on the command line (or in its environment variable), not a default.
fn run(cli: Cli, given: &dyn Fn(&str) -> bool) -> anyhow::Result<u8> {
    match cli.command {
        Command::Info(a) => {
            let p = read_settings(&a.picture)?;
            if a.json {
                println!("{}", serde_json::to_string(&p)?);
            } else {
                println!("{}", moss::metadata::printable(&p.a1111()));
            }
            Ok(0)
        }
        Command::Completions(a) => {
            clap_complete::generate(a.shell, &mut Cli::command(), "moss", &mut std::io::stdout());
            Ok(0)
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(0)
        }
        Command::Generate(a) if a.batch.prompts.is_some() => {
            if given("uncond_skip") {
                warn_skips_beyond(&a.uncond_skip.0, &a.model.model, a.quiet);
            }
            run_batch(&a, a.batch.prompts.as_deref().unwrap())
        }
        Command::Generate(mut a) => {
            if let Some(f) = a.batch.stray_flag() {
                anyhow::bail!("{f} applies to batch mode only: give --prompts FILE (not --prompt)");
            }
            if let Some(pic) = a.from.clone() {
                apply_from(&mut a, &pic, given)?;
            }
            if given("uncond_skip") {
                warn_skips_beyond(&a.uncond_skip.0, &a.model.model, a.quiet);
            }
            if a.embeds.is_some() && (a.prompt.prompt.is_some() || a.prompt.prompt_file.is_some() || given("negative")) {
                anyhow::bail!("--embeds brings its own prompt and negative: leave out --prompt, --prompt-file and --negative");
            }
            let prompt = prompt_text(&a.prompt)?;
            let several = a.count.is_some_and(|c| c > 1) || a.seeds.is_some() || a.out.to_string_lossy().contains('{');
            if let (true, Some(p)) = (several, &prompt) {
                return run_several(&a, p.clone());
            }
            if prompt.is_none() && a.embeds.is_none() {
                anyhow::bail!("give --prompt, --prompt-file, --embeds, --prompts or --from");
            }
            let seed = a.seed.resolve();
            // The seed is said whenever it was not given (a drawn one, or the default); after the
            // run, beside the path, so a refusal stays one line.
            let say_seed = (a.seed == Seed::Random || (!given("seed") && a.from.is_none())) && !a.quiet;
            let seed_note = format!("moss: seed {seed}{}", if a.seed == Seed::Random { " (random)" } else { " (default)" });
            let req = Request {
                prompt: prompt.unwrap_or_default(),
                negative: a.prompt.negative.clone(),
                seed,
                steps: a.steps,
                guidance: a.guidance,
                width: a.size.0,
                height: a.size.1,
                out: a.out.clone(),
                save_latents: a.save_latents.clone(),
                embeds: a.embeds.clone(),
                prompt_file: a.prompt.prompt_file.clone(),
                from: a.from.clone(),
                device: a.model.device,
                uncond_skip: a.uncond_skip.0.clone(),
                skip_window: a.skip_window,
                max_tokens: a.prompt.max_tokens as usize,
                precision: a.precision,
                quality: a.quality,
                cut: Default::default(),
            };
            let to_stdout = moss::output::is_stdout(&a.out) || a.save_latents.as_deref().is_some_and(moss::output::is_stdout);
            if to_stdout && a.json {
                anyhow::bail!("--json and an output on stdout (-) cannot share stdout");
            }
            let mut bars = Bars::new(a.quiet || a.json);
            bars.verbose = a.verbose;
            let mem = pipeline::MemoryOptions { max_vram_gib: a.max_vram };
            let rep = pipeline::generate_planned(&req, &a.model.model, &a.lora, a.model.device, &mem, &mut bars)?;
            if a.verbose {
                bars.say(&rep.timing_line());
            }
            drop(bars);
            if say_seed && !a.json {
                eprintln!("{seed_note}");
            }
            if a.json {
                println!("{}", rep.json());
            } else if !a.quiet && !to_stdout {
                println!("{}", rep.path.display());
            }
            Ok(0)
        }
        Command::Encode(a) => {
            let prompt = prompt_text(&a.prompt)?.ok_or_else(|| anyhow::anyhow!("give --prompt or --prompt-file"))?;
            let mut bars = Bars::new(a.quiet);
            if let Some(f) = &a.prompt.prompt_file {
                moss::output::check_distinct(&[("--out", &a.out)], &[("the prompt file", f)])?;
            }
            let job = pipeline::EncodeJob {
                prompt: &prompt,
                negative: &a.prompt.negative,
                max_tokens: a.prompt.max_tokens as usize,
                precision: a.precision,
                out: &a.out,
            };
            pipeline::encode_to_file(&job, &a.model.model, a.model.device, &mut bars)?;
            drop(bars);
            if !a.quiet && !moss::output::is_stdout(&a.out) {
                println!("{}", a.out.display());
            }
            Ok(0)
        }
        Command::Decode(a) => {
            let job = pipeline::DecodeJob { latents: &a.latents, size: a.size, out: &a.out, quality: a.quality, strip_rows: a.strip_rows };
            let mut bars = Bars::new(a.quiet);
            pipeline::decode_file(&job, &a.model.model, a.model.device, &mut bars)?;
            drop(bars);
            if !a.quiet && !moss::output::is_stdout(&a.out) {
                println!("{}", a.out.display());
            }
            Ok(0)
        }
        Command::BenchDit(a) => {
            let b = moss::bench::BenchDit {
                model: a.model.model.clone(),
                embeds: a.embeds.clone(),
                width: a.size.0,
                height: a.size.1,
                steps: a.steps,
                seed: a.seed,
                guidance: a.guidance,
                uncond_skip: a.uncond_skip.0.clone(),
                skip_window: a.skip_window,
                precision: a.precision,
                forwards: a.forwards,
                forward_only: a.forward_only,
                save_latents: a.save_latents.clone(),
                save_velocity: a.save_velocity.clone(),
            };
            println!("{}", moss::bench::run(&b, a.model.device)?);
            Ok(0)
        }
        Command::BenchVae(a) => {
            let b = moss::bench_vae::BenchVae {
                model: a.model.model.clone(),
                latents: a.latents.clone(),
                reps: a.reps,
                out_f32: a.out_f32.clone(),
                out_rgb: a.out_rgb.clone(),
                decode_only: a.decode_only,
                strip_rows: a.strip_rows,
                keep_gib: a.keep_gib,
                plan_free_gib: a.plan_free_gib,
            };
            println!("{}", moss::bench_vae::run(&b, a.model.device)?);
            Ok(0)
        }
        Command::Serve(a) => {
            if given("uncond_skip") {
                warn_skips_beyond(&a.uncond_skip.0, &a.model.model, false);
            }
            moss::serve::run(moss::serve::ServeOptions {
                model: a.model.model,
                device: a.model.device,
                precision: a.precision,
                host: a.host,
                port: a.port,
                api_key: a.api_key,
                allow_insecure_bind: a.allow_insecure_bind,
                allow_origins: a.allow_origin,
                max_queue: a.max_queue,
                max_size: a.max_size,
                max_steps: a.max_steps,
                max_tokens: a.max_tokens,
                max_body: a.max_body,
                client_timeout: std::time::Duration::from_secs(a.client_timeout),
                uncond_skip: a.uncond_skip.0,
                skip_window: a.skip_window,
                loras: a.lora,
                memory: pipeline::MemoryOptions { max_vram_gib: a.max_vram },
            })?;
            Ok(0)
        }
        Command::Check(a) => {
            let ck = pipeline::open_checkpoint(&a.model)?;
            Ok(if moss::check::run(&ck, a.device, moss::check::GateOptions { seed: a.seed, verbose: a.verbose }) { 0 } else { 1 })
        }
        Command::BenchEncode(a) => {
            moss::bench_encoder::run(&moss::bench_encoder::BenchEncode {
                model: a.model,
                ids_files: a.ids_file,
                count: a.ids,
                seed: a.seed,
                reps: a.reps,
                device: a.device,
                precision: a.precision,
                outs: a.out,
            })?;
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            // clap's whole message: the problem, the usage line, suggestions (`--promt`: did you
            // mean `--prompt`?); help and version on stdout with exit 0.
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    if !matches!(cli.command, Command::Serve(_)) {
        // A closed stdout (`moss check | head -1`) ends the process quietly, as for other tools.
        // (Not for the server, whose sockets must never kill it.)
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let sub = matches.subcommand().map(|(_, m)| m.clone());
    let given = move |id: &str| {
        sub.as_ref().is_some_and(|m| {
            m.try_get_raw(id).ok().flatten().is_some()
                && !matches!(m.value_source(id), Some(clap::parser::ValueSource::DefaultValue) | None)
        })
    };
    match run(cli, &given) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("moss: error: {}", msg.replace('\n', " "));
            ExitCode::from(1)
        }
    }
}
