//! Hostile inputs, round 2: picture bombs, endless and cyclic inputs, outputs that are inputs,
//! latents whose settings disagree with them. Every case runs the real binary under a memory
//! bound (`ulimit -v`: [`PICTURE_KIB`] for reading a picture, [`RUN_KIB`] for runs that load
//! the tiny checkpoint) and a wall-clock bound, and must either succeed as stated or stop with one
//! `moss: error:` line and exit 1: no signal, no abort, nothing written, the existing output
//! untouched. The hostile files are made here (pictures patched after encoding, FIFOs fed by a
//! thread that writes without end).

mod common;

use common::golden;
use moss::metadata::Params;
use moss::png::Metadata;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Address space for `moss info` and for reading a picture: 1 GiB.
const PICTURE_KIB: u64 = 1 << 20;
/// Address space for runs that load the tiny checkpoint: 4 GiB.
const RUN_KIB: u64 = 4 << 20;

fn scratch(tag: &str) -> PathBuf {
    common::folders::scratch("hostile2", tag)
}

fn tiny() -> PathBuf {
    golden().join("tiny-a")
}

/// `moss ARGS` under `ulimit -v KIB` and a 120 s wall limit; `stdin`: a file for standard input.
fn moss_under(kib: u64, args: &[&str], stdin: Option<&Path>) -> (Output, Duration) {
    let t = Instant::now();
    let mut c = Command::new("timeout");
    c.args(["120", "sh", "-c", &format!("ulimit -v {kib}; exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_moss")]).args(args);
    c.stdin(match stdin {
        Some(p) => Stdio::from(std::fs::File::open(p).unwrap()),
        None => Stdio::null(),
    });
    let o = c.output().expect("timeout and sh");
    (o, t.elapsed())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 1 with one `moss: error:` line (warnings aside), within the time bound; `kept`: files
/// that must still hold their bytes. Returns the error line.
fn refused(case: &str, (o, took): &(Output, Duration), kept: &[(&Path, &[u8])]) -> String {
    let err = stderr(o);
    assert!(*took < Duration::from_secs(60), "{case}: took {took:?}");
    assert_eq!(o.status.code(), Some(1), "{case}: exit {:?} (a signal, an abort or the memory bound?):\n{err}", o.status);
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("moss: warning:")).collect();
    assert_eq!(lines.len(), 1, "{case}: not one error line:\n{err}");
    assert!(lines[0].starts_with("moss: error: "), "{case}: {err}");
    for (p, bytes) in kept {
        assert!(std::fs::read(p).unwrap() == *bytes, "{case}: {} was changed", p.display());
    }
    println!("{case}: {}", lines[0]);
    lines[0].to_string()
}

fn succeeded(case: &str, (o, took): &(Output, Duration)) -> String {
    assert!(*took < Duration::from_secs(60), "{case}: took {took:?}");
    assert_eq!(o.status.code(), Some(0), "{case}: {:?}\n{}", o.status, stderr(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Settings that render in a moment on tiny-a (64x64, one step, on the CPU).
fn settings(prompt: &str) -> Params {
    Params {
        spec: moss::spec::PictureSpec { prompt: prompt.into(), seed: 3, steps: 1, width: 64, height: 64, uncond_skip: vec![], ..Default::default() },
        prompt_tokens_before_cut: None,
        negative_tokens_before_cut: None,
        device: "cpu".into(),
        model: tiny().display().to_string(),
        model_revision: "local".into(),
        model_hash: None,
        loras: vec![],
        forwards: None,
        version: moss::metadata::version(),
    }
}

fn set_crc(b: &mut [u8], chunk_at: usize) {
    let len = u32::from_be_bytes(b[chunk_at..chunk_at + 4].try_into().unwrap()) as usize;
    let crc = crc32fast::hash(&b[chunk_at + 4..chunk_at + 8 + len]);
    b[chunk_at + 8 + len..chunk_at + 12 + len].copy_from_slice(&crc.to_be_bytes());
}

/// A 16x16 moss PNG carrying `meta` whose header then claims `w` x `h`; `rgba16`: and 16-bit RGBA.
fn png_claiming(meta: &Metadata, w: u32, h: u32, rgba16: bool) -> Vec<u8> {
    let mut b = moss::png::encode(&[90; 16 * 16 * 3], 16, 16, meta).unwrap();
    b[16..20].copy_from_slice(&w.to_be_bytes());
    b[20..24].copy_from_slice(&h.to_be_bytes());
    if rgba16 {
        (b[24], b[25]) = (16, 6);
    }
    set_crc(&mut b, 8);
    b
}

/// A moss PNG with a zTXt chunk `key` (before IEND) that inflates to `inflated` zero bytes.
fn png_with_ztxt_bomb(meta: &Metadata, key: &str, inflated: u64) -> Vec<u8> {
    let mut data = key.as_bytes().to_vec();
    data.extend([0, 0]); // the keyword's end, compression method 0
    let mut z = fdeflate::Compressor::new(data).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..inflated >> 20 {
        z.write_data(&zeros).unwrap();
    }
    let data = z.finish().unwrap();
    let mut b = moss::png::encode(&[90; 16 * 16 * 3], 16, 16, meta).unwrap();
    let iend = b.len() - 12;
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend(b"zTXt");
    chunk.extend(&data);
    chunk.extend([0; 4]);
    set_crc(&mut chunk, 0);
    b.splice(iend..iend, chunk);
    b
}

/// A moss JPEG whose frame header (SOF) then claims `w` x `h`.
fn jpeg_claiming(meta: &Metadata, w: u16, h: u16) -> Vec<u8> {
    let mut b = moss::picture::encode(Path::new("x.jpg"), None, &[90; 16 * 16 * 3], 16, 16, meta).unwrap().bytes;
    let mut at = 2;
    loop {
        assert_eq!(b[at], 0xFF, "a JPEG marker");
        let marker = b[at + 1];
        let len = u16::from_be_bytes([b[at + 2], b[at + 3]]) as usize;
        if (0xC0..=0xC2).contains(&marker) {
            b[at + 5..at + 7].copy_from_slice(&h.to_be_bytes());
            b[at + 7..at + 9].copy_from_slice(&w.to_be_bytes());
            return b;
        }
        at += 2 + len;
    }
}

/// A moss WebP (lossless, extended: VP8X, VP8L, EXIF) whose canvas and bitstream claim `side`
/// pixels a side.
fn webp_claiming(meta: &Metadata, side: u32) -> Vec<u8> {
    let mut b = moss::picture::encode(Path::new("x.webp"), None, &[90; 16 * 16 * 3], 16, 16, meta).unwrap().bytes;
    let find = |b: &[u8], tag: &[u8]| b.windows(4).position(|w| w == tag).unwrap();
    let x = find(&b, b"VP8X") + 8;
    b[x + 4..x + 7].copy_from_slice(&(side - 1).to_le_bytes()[..3]);
    b[x + 7..x + 10].copy_from_slice(&(side - 1).to_le_bytes()[..3]);
    let l = find(&b, b"VP8L") + 8;
    assert_eq!(b[l], 0x2f);
    let v = u32::from_le_bytes(b[l + 1..l + 5].try_into().unwrap());
    let v = (v & !0x0FFF_FFFF) | (side - 1) | ((side - 1) << 14);
    b[l + 1..l + 5].copy_from_slice(&v.to_le_bytes());
    b
}

#[test]
fn picture_bombs_are_read_without_decoding_pixels() {
    let d = scratch("bombs");
    let meta = settings("a fox in the snow").to_png();
    let bombs: Vec<(&str, Vec<u8>)> = vec![
        ("png-100000x2147483647-rgba16.png", png_claiming(&meta, 100_000, i32::MAX as u32, true)),
        ("png-60000x60000.png", png_claiming(&meta, 60_000, 60_000, false)),
        ("png-8193x16.png", png_claiming(&meta, 8193, 16, false)),
        // Within the side limit, above the allocation limit (8000 x 8000 x 8 bytes).
        ("png-8000x8000-rgba16.png", png_claiming(&meta, 8000, 8000, true)),
        ("jpeg-65500x65500.jpg", jpeg_claiming(&meta, 65_500, 65_500)),
        ("jpeg-20000x20000.jpg", jpeg_claiming(&meta, 20_000, 20_000)),
        ("webp-16384x16384.webp", webp_claiming(&meta, 16_384)),
    ];
    for (name, bytes) in &bombs {
        // In this process: the one decoding function refuses each from its header, at once.
        let t = Instant::now();
        let e = moss::picture_in::decode_limited(bytes).unwrap_err().to_string();
        assert!(t.elapsed() < Duration::from_secs(2), "{name}: {:?}", t.elapsed());
        println!("{name}: decode_limited: {e}");
        assert!(moss::picture::decode(bytes).is_err(), "{name}");
        // `moss info` reads the settings without a pixel decoded, within the bound.
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        let out = succeeded(name, &moss_under(PICTURE_KIB, &["info", p.to_str().unwrap()], None));
        assert!(out.starts_with("a fox in the snow\nSteps: 1,"), "{name}: {out}");
    }
    // `generate --from` a bomb renders its recorded settings (the bomb's pixels are never read).
    for (name, _) in &bombs[..2] {
        let (out, src) = (d.join(format!("{name}.out.png")), d.join(name));
        let args = ["generate", "--from", src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet"];
        succeeded(name, &moss_under(RUN_KIB, &args, None));
        let (_, w, h, m) = moss::png::decode(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!((w, h), (64, 64));
        assert_eq!(Params::from_png(&m).unwrap().spec.prompt, "a fox in the snow");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_text_chunk_that_inflates_past_the_cap_is_refused() {
    let d = scratch("ztxt");
    let mut meta = settings("x").to_png();
    meta.entries.retain(|e| e.0 != "moss");
    // 2 GiB inflated (twice the memory bound), some 10 MB on disk.
    let bomb = png_with_ztxt_bomb(&meta, "moss", 2 << 30);
    println!("zTXt bomb: {} bytes", bomb.len());
    let p = d.join("bomb.png");
    std::fs::write(&p, &bomb).unwrap();
    let e = refused("info", &moss_under(PICTURE_KIB, &["info", p.to_str().unwrap()], None), &[]);
    assert!(e.contains("bomb.png") && e.contains("`moss` inflates past 16 MiB"), "{e}");
    let out = d.join("out.png");
    std::fs::write(&out, b"keep").unwrap();
    let args = ["generate", "--from", p.to_str().unwrap(), "-o", out.to_str().unwrap()];
    let e = refused("generate --from", &moss_under(RUN_KIB, &args, None), &[(&out, b"keep"), (&p, &bomb)]);
    assert!(e.contains("inflates past 16 MiB"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn info_escapes_control_characters() {
    let d = scratch("escapes");
    let p = d.join("p.png");
    std::fs::write(&p, moss::png::encode(&[0; 16 * 16 * 3], 16, 16, &settings("a\u{1b}]0;owned\u{7}\rfox").to_png()).unwrap()).unwrap();
    let out = succeeded("info", &moss_under(PICTURE_KIB, &["info", p.to_str().unwrap()], None));
    assert!(!out.bytes().any(|b| b == 0x1b || b == 0x07 || b == b'\r'), "raw control bytes printed: {out:?}");
    assert!(out.starts_with("a\\u{1b}]0;owned\\u{7}\\u{d}fox\n"), "{out}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `moss generate` on tiny-a (or `model`), 64x64, one step, on the CPU, plus `extra`.
/// `--force`: a hostile input must be refused, and the "keep" files left, even where replacing an
/// output is allowed.
fn generate_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["generate", "--device", "cpu", "--model", model, "--steps", "1", "--size", "64x64", "--quiet", "--force"];
    a.extend_from_slice(extra);
    a
}

#[test]
fn inputs_are_never_outputs() {
    let d = scratch("inputs");
    let m = tiny().display().to_string();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // A LoRA (rank 2 on one matrix) named like a picture, a LoRA as --save-latents.
    let lora = d.join("l.png");
    let f32s = |n: usize| -> Vec<u8> { (0..n).flat_map(|i| (i as f32 * 1e-3).to_le_bytes()).collect() };
    let (a, b) = (f32s(2 * 128), f32s(128 * 2));
    let views = [
        ("layers.0.proj.q.lora_A.weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 128], &a).unwrap()),
        ("layers.0.proj.q.lora_B.weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![128, 2], &b).unwrap()),
    ];
    let lora_bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(&lora, &lora_bytes).unwrap();
    let (l, out) = (s(&lora), s(&d.join("o.png")));
    let e =
        refused("--lora l.png -o l.png", &moss_under(RUN_KIB, &generate_args(&m, &["--prompt", "x", "--lora", &l, "-o", &l]), None), &[(&lora, &lora_bytes)]);
    assert!(e.contains("would overwrite the LoRA"), "{e}");
    let args = generate_args(&m, &["--prompt", "x", "--lora", &l, "-o", &out, "--save-latents", &l]);
    let e = refused("--save-latents onto the LoRA", &moss_under(RUN_KIB, &args, None), &[(&lora, &lora_bytes)]);
    assert!(e.contains("--save-latents") && e.contains("would overwrite the LoRA"), "{e}");
    // PEFT's adapter_config.json beside a LoRA is read too.
    let cfg = d.join("adapter_config.json");
    let e = refused("-o adapter_config.json", &moss_under(RUN_KIB, &generate_args(&m, &["--prompt", "x", "--lora", &l, "-o", &s(&cfg)]), None), &[]);
    assert!(e.contains("would overwrite the LoRA's config"), "{e}");
    assert!(!cfg.exists());
    // The --from picture, as -o and as a seed's name.
    let from = d.join("7.png");
    let from_bytes = moss::png::encode(&[9; 16 * 16 * 3], 16, 16, &settings("a fox").to_png()).unwrap();
    std::fs::write(&from, &from_bytes).unwrap();
    let f = s(&from);
    let e = refused("--from p.png -o p.png", &moss_under(RUN_KIB, &generate_args(&m, &["--from", &f, "--seed", "7", "-o", &f]), None), &[(&from, &from_bytes)]);
    assert!(e.contains("would overwrite the --from picture"), "{e}");
    let template = s(&d.join("{seed}.png"));
    let (o, took) = moss_under(RUN_KIB, &generate_args(&m, &["--from", &f, "--seeds", "7,8", "-o", &template]), None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(took < Duration::from_secs(60));
    assert!(stderr(&o).contains("would overwrite the --from picture"), "{}", stderr(&o));
    assert!(std::fs::read(&from).unwrap() == from_bytes, "the --from picture was replaced");
    assert!(d.join("8.png").exists(), "the other seed is rendered");
    // Batch mode: an item's `out` onto a LoRA.
    let list = d.join("list.jsonl");
    std::fs::write(&list, "{\"prompt\": \"x\", \"out\": \"l.png\"}\n").unwrap();
    let args = generate_args(&m, &["--prompts", list.to_str().unwrap(), "--out-dir", d.to_str().unwrap(), "--lora", &l]);
    let (o, _) = moss_under(RUN_KIB, &args, None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("would overwrite the LoRA"), "{}", stderr(&o));
    assert!(std::fs::read(&lora).unwrap() == lora_bytes);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn link_loops_in_the_checkpoint_folder_end() {
    let d = scratch("loops");
    let m = d.join("m");
    common::folders::copy_dir(&tiny(), &m);
    for (link, to) in [("a", "."), ("b", "."), ("transformer/up", ".."), ("vae/self", "../vae")] {
        std::os::unix::fs::symlink(to, m.join(link)).unwrap();
    }
    let ms = m.to_str().unwrap();
    let out = d.join("o.png");
    succeeded("generate", &moss_under(RUN_KIB, &generate_args(ms, &["--prompt", "x", "-o", out.to_str().unwrap()]), None));
    assert!(std::fs::read(&out).unwrap().starts_with(b"\x89PNG"));
    // A checkpoint file spelt through the loop is still an input.
    let index = std::fs::read(m.join("model_index.json")).unwrap();
    let through = m.join("a/b/a/transformer/up/model_index.json");
    let e = refused(
        "-o through the loop",
        &moss_under(RUN_KIB, &generate_args(ms, &["--prompt", "x", "-o", through.to_str().unwrap()]), None),
        &[(&m.join("model_index.json"), &index)],
    );
    assert!(e.contains("would overwrite a checkpoint file"), "{e}");
    let emb = d.join("e.safetensors");
    succeeded("encode", &moss_under(RUN_KIB, &["encode", "--device", "cpu", "--model", ms, "--prompt", "x", "--out", emb.to_str().unwrap()], None));
    let list = d.join("list.txt");
    std::fs::write(&list, "a fox\n").unwrap();
    let args = generate_args(ms, &["--prompts", list.to_str().unwrap(), "--out-dir", d.to_str().unwrap(), "--name", "b{index}.png"]);
    succeeded("batch", &moss_under(RUN_KIB, &args, None));
    assert!(d.join("b0.png").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// A FIFO at `path` fed with `byte` without end: every reader that opens it gets bytes until it
/// closes it. Stops when dropped.
struct Endless {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endless {
    fn at(path: &Path, byte: u8) -> Endless {
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (path.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let buf = vec![byte; 1 << 16];
            while !s.load(Ordering::Relaxed) {
                // Non-blocking: fails until a reader has opened the FIFO.
                let Ok(mut f) = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&p) else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                if !f.metadata().is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type())) {
                    return; // no longer the FIFO
                }
                loop {
                    match f.write(&buf) {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if s.load(Ordering::Relaxed) {
                                return;
                            }
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        Err(_) => break, // the reader closed it
                    }
                }
            }
        });
        Endless { stop, thread: Some(thread) }
    }
}

impl Drop for Endless {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.take().map(|t| t.join());
    }
}

#[test]
fn endless_inputs_stop_at_their_limit() {
    let d = scratch("endless");
    let out = d.join("o.png");
    std::fs::write(&out, b"keep").unwrap();
    let o = out.to_str().unwrap().to_string();
    let m = tiny().display().to_string();
    let fifo = |name: &str| -> (PathBuf, Endless) {
        let p = d.join(name);
        let e = Endless::at(&p, b'x');
        (p, e)
    };
    let check = |case: &str, args: &[&str], want: &[&str]| {
        let e = refused(case, &moss_under(RUN_KIB, args, None), &[(&out, b"keep")]);
        for w in want {
            assert!(e.contains(w), "{case}: {e}");
        }
    };
    let (p, _w) = fifo("prompt.txt");
    check("--prompt-file", &generate_args(&m, &["--prompt-file", p.to_str().unwrap(), "-o", &o]), &["prompt.txt", "4 MiB"]);
    let (p, _w) = fifo("embeds.safetensors");
    check("--embeds", &generate_args(&m, &["--embeds", p.to_str().unwrap(), "-o", &o]), &["embeds.safetensors", "512 MiB"]);
    let (p, _w) = fifo("latents.safetensors");
    check("decode", &["decode", p.to_str().unwrap(), "--device", "cpu", "--model", &m, "--out", &o], &["latents.safetensors", "MiB moss reads"]);
    let (p, _w) = fifo("list.txt");
    check("--prompts", &generate_args(&m, &["--prompts", p.to_str().unwrap(), "--out-dir", d.to_str().unwrap()]), &["list.txt", "256 MiB"]);
    let (p, _w) = fifo("pic.png");
    let e = refused("info", &moss_under(PICTURE_KIB, &["info", p.to_str().unwrap()], None), &[]);
    assert!(e.contains("pic.png") && e.contains("256 MiB"), "{e}");
    let e =
        refused("stdin", &moss_under(RUN_KIB, &generate_args(&m, &["--prompts", "-", "--out-dir", d.to_str().unwrap()]), Some(Path::new("/dev/zero"))), &[]);
    assert!(e.contains("stdin") && e.contains("256 MiB"), "{e}");
    // A checkpoint config: a FIFO without end, and a sparse file of 1 GiB (refused by its length).
    let mm = d.join("m");
    common::folders::copy_dir(&tiny(), &mm);
    std::fs::remove_file(mm.join("transformer/config.json")).unwrap();
    {
        let _w = Endless::at(&mm.join("transformer/config.json"), b' ');
        check("config.json FIFO", &generate_args(mm.to_str().unwrap(), &["--prompt", "x", "-o", &o]), &["transformer/config.json", "16 MiB"]);
    }
    std::fs::File::create(mm.join("vae/config.json")).unwrap().set_len(1 << 30).unwrap();
    std::fs::remove_file(mm.join("transformer/config.json")).unwrap();
    std::fs::copy(tiny().join("transformer/config.json"), mm.join("transformer/config.json")).unwrap();
    check("sparse config.json", &generate_args(mm.to_str().unwrap(), &["--prompt", "x", "-o", &o]), &["vae/config.json is 1073741824 bytes", "16 MiB"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A latents file as `--save-latents` writes it: f32 `[1, 128, h, w]` and the `moss` settings.
fn latents_file(h: usize, w: usize, settings: serde_json::Value) -> Vec<u8> {
    let data: Vec<u8> = (0..128 * h * w).flat_map(|i| ((i % 13) as f32 * 0.1 - 0.6).to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 128, h, w], &data).unwrap();
    let meta = std::collections::HashMap::from([("moss".to_string(), settings.to_string())]);
    safetensors::tensor::serialize([("latents", view)], Some(meta)).unwrap()
}

#[test]
fn decode_records_the_size_of_its_latents() {
    let d = scratch("decode");
    let m = tiny().display().to_string();
    let with = |w: u32, h: u32| {
        let mut p = settings("a fox");
        (p.spec.width, p.spec.height) = (w, h);
        let mut v = serde_json::to_value(p).unwrap();
        v["format"] = "moss-latents-1".into();
        v
    };
    // Latents [1,128,2,8] (a 128x32 picture) whose settings say 64x64, 0x64, 100000x64.
    for (case, settings) in [("64x64", with(64, 64)), ("0x64", with(0, 64)), ("100000x64", with(100_000, 64))] {
        let lat = d.join(format!("{case}.safetensors"));
        std::fs::write(&lat, latents_file(2, 8, settings)).unwrap();
        let out = d.join(format!("{case}.png"));
        let r = moss_under(RUN_KIB, &["decode", lat.to_str().unwrap(), "--device", "cpu", "--model", &m, "--out", out.to_str().unwrap()], None);
        succeeded(case, &r);
        let warning = stderr(&r.0);
        assert!(warning.contains(&format!("its settings say {case}, its latents are a 128x32 picture")), "{case}: {warning}");
        let (_, w, h, meta) = moss::png::decode(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!((w, h), (128, 32), "{case}");
        let p = Params::from_png(&meta).unwrap();
        assert_eq!((p.spec.width, p.spec.height), (128, 32), "{case}: the moss settings");
        assert!(meta.get("parameters").unwrap().contains("Size: 128x32,"), "{case}: {:?}", meta.get("parameters"));
        assert_eq!(p.spec.prompt, "a fox");
    }
    // Settings that do not read: said, and the picture records the model and the file.
    let lat = d.join("bad.safetensors");
    std::fs::write(&lat, latents_file(4, 4, serde_json::json!({"format": "moss-latents-1", "seed": "seven"}))).unwrap();
    let out = d.join("bad.png");
    let r = moss_under(RUN_KIB, &["decode", lat.to_str().unwrap(), "--device", "cpu", "--model", &m, "--out", out.to_str().unwrap()], None);
    succeeded("bad settings", &r);
    assert!(stderr(&r.0).contains("moss: warning:") && stderr(&r.0).contains("settings do not read"), "{}", stderr(&r.0));
    let (_, w, h, meta) = moss::png::decode(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!((w, h), (64, 64));
    assert_eq!(meta.get("moss:source"), Some(lat.to_str().unwrap()));
    assert!(meta.get("moss").is_none());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_cache_ref_outside_snapshots_is_refused() {
    let d = scratch("refs");
    let repo = d.join("hub/models--t--m");
    common::folders::copy_dir(&tiny(), &repo.join("snapshots/abc"));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    // Another pipeline folder outside snapshots/ that `../..` would reach.
    common::folders::copy_dir(&tiny(), &d.join("hub/outside"));
    std::fs::write(repo.join("refs/main"), "../../outside").unwrap();
    let out = d.join("o.png");
    std::fs::write(&out, b"keep").unwrap();
    let mut args = generate_args("t/m", &["--prompt", "x", "-o", out.to_str().unwrap()]);
    let (o, took) = {
        let t = Instant::now();
        let o = Command::new(env!("CARGO_BIN_EXE_moss")).args(&args).env("HF_HUB_CACHE", d.join("hub")).output().unwrap();
        (o, t.elapsed())
    };
    let e = refused("refs/main ../..", &(o, took), &[(&out, b"keep")]);
    assert!(e.contains("refs/main names \"../../outside\", not a snapshot"), "{e}");
    // A plain revision loads.
    std::fs::write(repo.join("refs/main"), "abc\n").unwrap();
    args.push("--json");
    let o = Command::new(env!("CARGO_BIN_EXE_moss")).args(&args).env("HF_HUB_CACHE", d.join("hub")).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_rank_0_lora_is_refused_at_load_by_name() {
    let d = scratch("rank0");
    let lora = d.join("rank0.safetensors");
    let (a, b) = (Vec::<u8>::new(), Vec::<u8>::new());
    let views = [
        ("layers.0.proj.q.lora_A.weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![0, 128], &a).unwrap()),
        ("layers.0.proj.q.lora_B.weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![128, 0], &b).unwrap()),
    ];
    std::fs::write(&lora, safetensors::serialize(views, None).unwrap()).unwrap();
    let out = d.join("o.png");
    std::fs::write(&out, b"keep").unwrap();
    let m = tiny().display().to_string();
    let args = generate_args(&m, &["--prompt", "x", "--lora", lora.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let e = refused("rank 0", &moss_under(RUN_KIB, &args, None), &[(&out, b"keep")]);
    assert!(e.contains("LoRA") && e.contains("rank0.safetensors") && e.contains("layers.0.proj.q") && e.contains("rank"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}
