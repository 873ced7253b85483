use clap::Parser;

use indicatif::{ProgressBar, ProgressStyle};
use moss::cli::{Cli, Command, PromptArgs};
use moss::pipeline::{self, Progress, Request};
use std::io::IsTerminal;
use std::process::ExitCode;

/// Progress bars on a terminal, nothing otherwise.
struct Bars {
    bar: Option<ProgressBar>,
    enabled: bool,
    quiet: bool,
}

impl Bars {
    fn new(quiet: bool) -> Bars {
        Bars { bar: None, enabled: !quiet && std::io::stderr().is_terminal(), quiet }
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
            match &self.bar {
                Some(b) => b.suspend(|| eprintln!("moss: warning: {msg}")),
                None => eprintln!("moss: warning: {msg}"),
            }
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

fn prompt_text(p: &PromptArgs) -> anyhow::Result<Option<String>> {
    match (&p.prompt, &p.prompt_file) {
        (Some(t), _) => Ok(Some(t.clone())),
        (None, Some(f)) => Ok(Some(moss::prompt::read_prompt_file(f)?)),
        (None, None) => Ok(None),
    }
}

fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Generate(a) => {
            let prompt = prompt_text(&a.prompt)?;
            if prompt.is_none() && a.embeds.is_none() {
                anyhow::bail!("give --prompt, --prompt-file or --embeds");
            }
            let req = Request {
                prompt: prompt.unwrap_or_default(),
                negative: a.prompt.negative.clone(),
                seed: a.seed,
                steps: a.steps,
                guidance: a.guidance,
                width: a.size.0,
                height: a.size.1,
                out: a.out.clone(),
                save_latents: a.save_latents.clone(),
                embeds: a.embeds.clone(),
                uncond_skip: a.uncond_skip.0.clone(),
                skip_window: a.skip_window,
                max_tokens: a.prompt.max_tokens as usize,
            };
            let mut bars = Bars::new(a.quiet || a.json);
            let rep = pipeline::generate(&req, &a.model.model, a.model.device, &mut bars)?;
            drop(bars);
            if a.json {
                println!("{}", rep.json());
            } else if !a.quiet {
                println!("{}", rep.path.display());
            }
            Ok(true)
        }
        Command::Encode(a) => {
            let prompt = prompt_text(&a.prompt)?.ok_or_else(|| anyhow::anyhow!("give --prompt or --prompt-file"))?;
            let mut bars = Bars::new(a.quiet);
            pipeline::encode_to_file(
                &prompt,
                &a.prompt.negative,
                a.prompt.max_tokens as usize,
                &a.out,
                &a.model.model,
                a.model.device,
                &mut bars,
            )?;
            drop(bars);
            if !a.quiet {
                println!("{}", a.out.display());
            }
            Ok(true)
        }
        Command::Decode(a) => {
            pipeline::decode_file(&a.latents, a.size, &a.out, &a.model.model, a.model.device)?;
            if !a.quiet {
                println!("{}", a.out.display());
            }
            Ok(true)
        }
        Command::Check(a) => {
            let ck = pipeline::open_checkpoint(&a.model)?;
            Ok(moss::check::run(&ck, a.device))
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line naming the problem (clap's first line), as for every other error.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("moss: {}", first.trim());
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("moss: error: {}", msg.replace('\n', " "));
            ExitCode::from(1)
        }
    }
}
