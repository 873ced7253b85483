//! Picture formats by the output's extension, through the binary on the golden tiny-a: `.jpg`/
//! `.jpeg` (with `--quality`) and `.webp` (lossless) decode with the `image` crate to the right
//! size, carry the parameters (`moss info`, `--from`), and WebP holds exactly the PNG's pixels;
//! an unknown extension or a `--quality` for a lossless format is refused before any work with
//! nothing written; batch names follow the same rule; `moss decode` writes them too.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn moss(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moss")).args(args).env_remove("MOSS_MODEL").output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = moss(args);
    assert!(o.status.success(), "moss {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit 1 with one `moss: error:` line containing `needle`, nothing on stdout.
fn refused(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected a refusal: {err}");
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("moss: error:") && lines[0].contains(needle), "{err}");
    assert!(o.stdout.is_empty());
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-formats-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny() -> String {
    common::golden().join("tiny-a").display().to_string()
}

fn gen<'a>(m: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "generate",
        "--device",
        "cpu",
        "--model",
        m,
        "--prompt",
        "a red fox, in snow: morning ☕",
        "--negative",
        "blurry",
        "--seed",
        "7",
        "--steps",
        "2",
        "--size",
        "64x48",
        "-q",
        "--out",
        out,
    ]
}

fn entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Width, height and RGB8 pixels: JPEG and WebP as the `image` crate decodes them (format from
/// the bytes), PNG with the `png` crate (moss builds `image` without its PNG codec).
fn image_rgb(p: &Path) -> (u32, u32, Vec<u8>) {
    let bytes = std::fs::read(p).unwrap();
    if bytes.starts_with(b"\x89PNG") {
        let (px, w, h, _) = moss::png::decode(&bytes).unwrap();
        return (w, h, px);
    }
    let img = image::ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().unwrap().decode().unwrap().to_rgb8();
    (img.width(), img.height(), img.into_raw())
}

fn info(p: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(&["info", "--json", p.to_str().unwrap()])).unwrap()
}

#[test]
fn jpeg_and_webp_by_extension() {
    let d = scratch("gen");
    let m = tiny();
    let (png, jpg, jpeg, webp) = (d.join("a.png"), d.join("a.jpg"), d.join("b.JPEG"), d.join("a.webp"));
    ok(&gen(&m, png.to_str().unwrap()));
    ok(&[&gen(&m, jpg.to_str().unwrap())[..], &["--quality", "95"]].concat());
    ok(&gen(&m, jpeg.to_str().unwrap()));
    ok(&gen(&m, webp.to_str().unwrap()));
    assert!(std::fs::read(&jpg).unwrap().starts_with(&[0xFF, 0xD8, 0xFF]), "a.jpg is not a JPEG");
    assert!(std::fs::read(&jpeg).unwrap().starts_with(&[0xFF, 0xD8, 0xFF]), "b.JPEG is not a JPEG");
    assert!(std::fs::read(&webp).unwrap()[8..12] == *b"WEBP", "a.webp is not a WebP");

    let (pw, ph, px) = image_rgb(&png);
    assert_eq!((pw, ph), (64, 48));
    for p in [&jpg, &jpeg, &webp] {
        let (w, h, q) = image_rgb(p);
        assert_eq!((w, h), (64, 48), "{}", p.display());
        let worst = q.iter().zip(&px).map(|(a, b)| (*a as i32 - *b as i32).abs()).max().unwrap();
        let mean = q.iter().zip(&px).map(|(a, b)| (*a as i32 - *b as i32).abs() as f64).sum::<f64>() / px.len() as f64;
        println!("{}: mean |diff| {mean:.2}, worst {worst} against the PNG", p.display());
        if p == &webp {
            assert_eq!(worst, 0, "WebP is lossless: the PNG's pixels");
        } else {
            assert!(mean < 12.0, "{}: not the same picture (mean |diff| {mean:.2})", p.display());
        }
    }
    // Quality 95 and the default 90 write different files.
    assert_ne!(std::fs::read(&jpg).unwrap(), std::fs::read(&jpeg).unwrap());

    // The parameters travel: moss info reads them back from every format, alike.
    let want = info(&png);
    for p in [&jpg, &jpeg, &webp] {
        assert_eq!(info(p), want, "{}", p.display());
        let t = ok(&["info", p.to_str().unwrap()]);
        assert!(t.starts_with("a red fox, in snow: morning ☕\nNegative prompt: blurry\nSteps: 2, Sampler: Euler"), "{t}");
        let (_, _, _, meta) = moss::picture::decode(&std::fs::read(p).unwrap()).unwrap();
        assert_eq!(meta.get("parameters"), Some(t.trim_end()), "{}: the EXIF UserComment", p.display());
    }
    // --from a JPEG renders the same picture again (same default quality: the same bytes).
    let again = d.join("again.jpg");
    ok(&["generate", "--from", jpeg.to_str().unwrap(), "--model", &tiny(), "-q", "--out", again.to_str().unwrap()]);
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&jpeg).unwrap(), "--from a JPEG differs");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn unknown_extensions_and_misplaced_quality_are_refused_before_any_work() {
    let d = scratch("refuse");
    let m = tiny();
    for (out, extra, needle) in [
        ("a.gif", &[][..], "no `.gif` pictures (use .png, .jpg, .jpeg or .webp)"),
        ("a.tiff", &[][..], "no `.tiff` pictures"),
        ("a.png", &["--quality", "80"][..], "--quality applies to JPEG"),
        ("a.webp", &["--quality", "80"][..], "--quality applies to JPEG"),
        ("-", &["--quality", "80"][..], "stdout (-) is written as PNG"),
    ] {
        let p = if out == "-" { out.to_string() } else { d.join(out).display().to_string() };
        refused(&moss(&[&gen(&m, &p)[..], extra].concat()), needle);
    }
    let tpl = d.join("fox-{seed}.gif");
    refused(&moss(&[&gen(&m, tpl.to_str().unwrap())[..], &["--count", "2"]].concat()), "fox-{seed}.gif: moss writes no `.gif`");
    let o = moss(&[&gen(&tiny(), d.join("a.jpg").to_str().unwrap())[..], &["--quality", "0"]].concat());
    assert_eq!(o.status.code(), Some(2), "clap refuses quality 0");
    // decode too, and batch names.
    let lat = d.join("z.f32");
    std::fs::write(&lat, vec![0u8; 4 * 128 * 16]).unwrap();
    refused(&moss(&["decode", lat.to_str().unwrap(), "--device", "cpu", "--model", &tiny(), "-o", d.join("x.bmp").to_str().unwrap()]), "no `.bmp` pictures");
    let list = d.join("list.txt");
    std::fs::write(&list, "a cat\n").unwrap();
    let batch = ["generate", "--device", "cpu", "--model", &tiny(), "--prompts", list.to_str().unwrap(), "--out-dir", d.to_str().unwrap()];
    refused(&moss(&[&batch[..], &["--name", "{index}.gif"]].concat()), "--name");
    refused(&moss(&[&batch[..], &["--quality", "80"]].concat()), "this batch writes none");
    assert_eq!(entries(&d), ["list.txt", "z.f32"], "something was written");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn batch_and_decode_follow_the_extension() {
    let d = scratch("batch");
    let m = tiny();
    let list = d.join("list.jsonl");
    std::fs::write(&list, "a cat\n{\"prompt\": \"a dog\", \"out\": \"dog.webp\"}\n{\"prompt\": \"an owl\", \"out\": \"owl.bmp\"}\n").unwrap();
    let out = d.join("out");
    let o = moss(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        &m,
        "--prompts",
        list.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
        "--name",
        "{index}-{seed}.jpg",
        "--quality",
        "85",
        "--steps",
        "1",
        "--size",
        "64x48",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "the .bmp item fails, the others are written: {err}");
    assert!(err.contains(":3: ") && err.contains("no `.bmp` pictures"), "{err}");
    assert_eq!(entries(&out), ["0-42.jpg", "dog.webp"]);
    assert_eq!(image_rgb(&out.join("0-42.jpg")).0, 64);
    assert_eq!(info(&out.join("dog.webp"))["prompt"], "a dog");

    // moss decode writes the saved latents as WebP, the same pixels as its PNG.
    let (lat, png, webp) = (d.join("z.latents"), d.join("z.png"), d.join("z.webp"));
    ok(&[&gen(&m, png.to_str().unwrap())[..], &["--save-latents", lat.to_str().unwrap()]].concat());
    ok(&["decode", lat.to_str().unwrap(), "--device", "cpu", "--model", &m, "-q", "-o", webp.to_str().unwrap()]);
    assert_eq!(image_rgb(&webp), image_rgb(&png));
    assert_eq!(info(&webp), info(&png));
    std::fs::remove_dir_all(&d).unwrap();
}
