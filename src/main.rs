//! `moss`: parses the command line and hands each command to the library; turns errors into one
//! line and an exit code.

mod cli;

use clap::{CommandFactory, FromArgMatches};
use cli::args::{Cli, Command};
use cli::bars::Bars;
use cli::generate::{prompt_text, warn_skips_beyond};
use moss::pipeline;
use std::process::ExitCode;

/// The exit code: 0 on success, 1 when something failed. `given(id)`: whether the flag with
/// that id was on the command line (or in its environment variable), not a default.
fn run(cli: Cli, given: &dyn Fn(&str) -> bool) -> anyhow::Result<u8> {
    if let Some(files) = cli::quantize::component_files(&cli.command) {
        pipeline::set_component_files(files);
    }
    match cli.command {
        Command::Info(a) => {
            cli::from::info(&a.picture, a.json)?;
            Ok(0)
        }
        Command::Completions(a) => {
            clap_complete::generate(a.shell, &mut Cli::command(), "moss", &mut std::io::stdout());
            Ok(0)
        }
        Command::Quantize(a) => cli::quantize::run(&a),
        Command::Man(a) => {
            match &a.out_dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
                    for page in cli::man::pages() {
                        let path = dir.join(&page.0);
                        moss::output::write(&path, &page.1)?;
                        println!("{}", path.display());
                    }
                }
                None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?,
            }
            Ok(0)
        }
        Command::Generate(a) if a.batch.prompts.is_some() => cli::generate::batch(&a, given),
        Command::Generate(a) => cli::generate::generate(a, given),
        Command::Encode(a) if a.image.is_some() => {
            let image = a.image.as_deref().unwrap_or(std::path::Path::new(""));
            pipeline::encode_image_to_file(image, &a.out, &a.model.model, a.model.device)?;
            if !a.quiet && !moss::output::is_stdout(&a.out) {
                println!("{}", a.out.display());
            }
            Ok(0)
        }
        Command::Encode(a) => {
            let prompt = prompt_text(&a.prompt)?.ok_or_else(|| anyhow::anyhow!("give --prompt or --prompt-file"))?;
            let spec = moss::spec::PictureSpec { prompt: prompt.clone(), ..Default::default() };
            spec.check_prompt().map_err(|e| match &a.prompt.prompt_file {
                Some(f) => anyhow::anyhow!("{}: {e}", f.display()),
                None => anyhow::anyhow!("--prompt: {e}"),
            })?;
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
            let b = cli::bench::dit::BenchDit {
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
            println!("{}", cli::bench::dit::run(&b, a.model.device)?);
            Ok(0)
        }
        Command::BenchVaeEncode(a) => {
            let b = cli::bench::vae_encode::BenchVaeEncode { model: a.model.model.clone(), image: a.image.clone(), reps: a.reps, out_f32: a.out_f32.clone() };
            println!("{}", cli::bench::vae_encode::run(&b, a.model.device)?);
            Ok(0)
        }
        Command::BenchCompare { a, b } => {
            println!("{}", cli::bench::compare::run(&a, &b)?);
            Ok(0)
        }
        Command::BenchVae(a) => {
            let b = cli::bench::vae::BenchVae {
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
            println!("{}", cli::bench::vae::run(&b, a.model.device)?);
            Ok(0)
        }
        Command::Serve(a) => {
            if given("uncond_skip") {
                warn_skips_beyond(&a.uncond_skip.0, &a.model.model, false);
            }
            moss::serve::run(moss::serve::ServeOptions {
                model: a.model.model,
                device: a.devices.as_ref().and_then(|d| d.first().copied()).unwrap_or(a.model.device),
                devices: a.devices.unwrap_or_default(),
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
                max_upload: a.max_upload,
                client_timeout: std::time::Duration::from_secs(a.client_timeout),
                uncond_skip: a.uncond_skip.0,
                skip_window: a.skip_window,
                served_model_names: a.served_model_name,
                loras: a.lora,
                lora_dir: a.lora_dir,
                memory: pipeline::MemoryOptions { max_vram_gib: a.max_vram },
                c2pa: a.c2pa.signer()?,
            })?;
            Ok(0)
        }
        Command::Check(a) => {
            let ck = pipeline::open_checkpoint(&a.model)?;
            Ok(if moss::check::run(&ck, a.device, moss::check::GateOptions { seed: a.seed, verbose: a.verbose }) { 0 } else { 1 })
        }
        Command::BenchEncode(a) => {
            cli::bench::encoder::run(&cli::bench::encoder::BenchEncode {
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
        sub.as_ref()
            .is_some_and(|m| m.try_get_raw(id).ok().flatten().is_some() && !matches!(m.value_source(id), Some(clap::parser::ValueSource::DefaultValue) | None))
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
