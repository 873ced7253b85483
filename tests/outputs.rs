//! Never a wrong file: where outputs go (symlinks followed, FIFOs and devices written through,
//! `-` is stdout), outputs that are inputs refused, paths checked before any work, stale
//! temporaries removed, batch items kept inside --out-dir. Every refusal: exit 1, one line,
//! nothing written, the existing file untouched.

mod common;

use common::golden;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn moss(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moss")).args(args).output().unwrap()
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-outputs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny() -> String {
    golden().join("tiny-a").display().to_string()
}

/// A cheap picture's flags (64x64, 1 step) on the golden checkpoint, on the CPU.
fn gen_args<'a>(model: &'a str, out: &'a str) -> Vec<&'a str> {
    vec!["generate", "--device", "cpu", "--model", model, "--prompt", "a cat", "--steps", "1", "--size", "64x64", "--out", out]
}

/// Exit 1 with one `moss: error:` line containing `needle`.
fn refused(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected a refusal, got {:?}: {err}", o.status.code());
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("moss: error:") && lines[0].contains(needle), "{err}");
    assert!(o.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&o.stdout));
}

fn entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn stdout_and_devices_are_written_through() {
    let d = scratch("stdout");
    let model = tiny();
    let o = moss(&gen_args(&model, "-"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout.starts_with(b"\x89PNG\r\n\x1a\n"), "stdout is not the PNG");
    let file = d.join("a.png");
    let o2 = moss(&gen_args(&model, file.to_str().unwrap()));
    assert!(o2.status.success());
    assert_eq!(std::fs::read(&file).unwrap(), o.stdout, "stdout holds the same bytes as the file");
    // /dev/null stays a device.
    let o = moss(&gen_args(&model, "/dev/null"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    // --json and a picture on stdout cannot share it.
    let mut a = gen_args(&model, "-");
    a.push("--json");
    refused(&moss(&a), "stdout");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_fifo_is_written_through_not_replaced() {
    let d = scratch("fifo");
    let fifo = d.join("pipe.png");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let model = tiny();
    let o = moss(&gen_args(&model, fifo.to_str().unwrap()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = reader.join().unwrap();
    assert!(got.starts_with(b"\x89PNG"), "the reader got {} bytes, not a PNG", got.len());
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    assert_eq!(entries(&d), ["pipe.png"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_symlink_is_followed() {
    let d = scratch("link");
    std::fs::create_dir_all(d.join("real")).unwrap();
    let target = d.join("real/pic.png");
    std::fs::write(&target, b"old").unwrap();
    let link = d.join("link.png");
    std::os::unix::fs::symlink("real/pic.png", &link).unwrap();
    let model = tiny();
    // An existing file behind the link is refused as the file itself would be, then replaced
    // with --force.
    let o = moss(&gen_args(&model, link.to_str().unwrap()));
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
    let o = moss(&[gen_args(&model, link.to_str().unwrap()), vec!["--force"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
    assert!(std::fs::read(&target).unwrap().starts_with(b"\x89PNG"), "the link's file was not written");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn outputs_that_are_inputs_are_refused_before_work() {
    let d = scratch("inputs");
    // A private copy of the checkpoint: a failing test must not destroy golden/.
    let model = d.join("model");
    assert!(Command::new("cp").arg("-r").arg(golden().join("tiny-a")).arg(&model).status().unwrap().success());
    let m = model.to_str().unwrap();
    let vae = model.join("vae/diffusion_pytorch_model.safetensors");
    let before = std::fs::read(&vae).unwrap();
    refused(&moss(&gen_args(m, vae.to_str().unwrap())), "would overwrite a checkpoint file");
    let spelled = format!("{m}/vae/../vae/diffusion_pytorch_model.safetensors");
    refused(&moss(&gen_args(m, &spelled)), "would overwrite a checkpoint file");
    assert_eq!(std::fs::read(&vae).unwrap(), before);

    let prompt = d.join("prompt.txt");
    std::fs::write(&prompt, "a cat").unwrap();
    let p = prompt.to_str().unwrap();
    let o = moss(&["generate", "--device", "cpu", "--model", m, "--prompt-file", p, "--steps", "1", "--size", "64x64", "--out", p]);
    refused(&o, "would overwrite the prompt file");
    assert_eq!(std::fs::read_to_string(&prompt).unwrap(), "a cat");

    let out = d.join("x.png");
    std::fs::write(&out, b"keep").unwrap();
    let mut a = gen_args(m, out.to_str().unwrap());
    a.extend(["--save-latents", out.to_str().unwrap()]);
    refused(&moss(&a), "are the same file");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");

    let o = moss(&["encode", "--device", "cpu", "--model", m, "--prompt-file", p, "--out", p]);
    refused(&o, "would overwrite the prompt file");
    let lat = d.join("z.f32");
    std::fs::write(&lat, vec![0u8; 4 * 128 * 16]).unwrap();
    let o = moss(&["decode", lat.to_str().unwrap(), "--device", "cpu", "--model", m, "--out", lat.to_str().unwrap()]);
    refused(&o, "would overwrite the latents file");
    assert_eq!(std::fs::metadata(&lat).unwrap().len(), 4 * 128 * 16);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_output_paths_fail_before_work_and_name_the_path() {
    let d = scratch("paths");
    let model = tiny();
    let newdir = format!("{}/newdir/", d.display());
    refused(&moss(&gen_args(&model, &newdir)), "names a folder");
    refused(&moss(&gen_args(&model, d.to_str().unwrap())), "is a folder");
    let long = d.join(format!("{}.png", "x".repeat(242)));
    refused(&moss(&gen_args(&model, long.to_str().unwrap())), "too long");
    let missing = d.join("no/such/pic.png");
    refused(&moss(&gen_args(&model, missing.to_str().unwrap())), "does not exist");
    assert!(entries(&d).is_empty(), "{:?}", entries(&d));
    // Disk full: the error names the path.
    let o = moss(&gen_args(&model, "/dev/full"));
    refused(&o, "/dev/full");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_killed_runs_temporary_is_removed_by_the_next_run() {
    let d = scratch("stale");
    let out = d.join("pic.png");
    // No live process has this pid (above the kernel's pid_max limit of 2^22).
    std::fs::write(d.join(".pic.png.99999999.partial"), b"half").unwrap();
    let model = tiny();
    let o = moss(&gen_args(&model, out.to_str().unwrap()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(entries(&d), ["pic.png"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn batch_items_stay_inside_the_out_dir() {
    let d = scratch("batch");
    let outdir = d.join("renders");
    std::fs::create_dir_all(&outdir).unwrap();
    let keep = d.join("keep.png");
    std::fs::write(&keep, b"keep").unwrap();
    let list = d.join("list.jsonl");
    let abs = d.join("abs.png");
    std::fs::write(
        &list,
        format!(
            "{{\"prompt\": \"x\", \"out\": \"../keep.png\"}}\n{{\"prompt\": \"y\", \"out\": \"{}\"}}\n\
             {{\"prompt\": \"z\", \"out\": \"same.png\"}}\n{{\"prompt\": \"w\", \"out\": \"sub/../same.png\"}}\n\
             {{\"prompt\": \"v\", \"out\": \"../list.jsonl\"}}\n",
            abs.display()
        ),
    )
    .unwrap();
    let model = tiny();
    let o = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &model,
        "--prompts",
        list.to_str().unwrap(),
        "--out-dir",
        outdir.to_str().unwrap(),
        "--steps",
        "1",
        "--size",
        "64x64",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(":1: output `../keep.png` leaves --out-dir"), "{err}");
    assert!(err.contains(":2: output") && err.contains("absolute"), "{err}");
    assert!(err.contains(":4: output") && err.contains("already line 3"), "{err}");
    assert!(err.contains(":5: output `../list.jsonl` leaves --out-dir"), "{err}");
    assert_eq!(std::fs::read(&keep).unwrap(), b"keep");
    assert!(!abs.exists());
    assert_eq!(entries(&outdir), ["same.png"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1, "one picture reported written");
    std::fs::remove_dir_all(&d).unwrap();
}
