//! `moss generate --init-image` end to end on the CPU (tiny-a): img2img and inpainting latents
//! against golden/make_img2img_e2e.py (diffusers' encoder, scheduler and mask, the torch DiT);
//! strength 1 gives text-to-image's pixels; the final picture keeps the input outside the mask's
//! feather (an all-keep mask returns the input); the settings record the pictures' sha256 and
//! `--from` asks for them again; outpainting and the hires fix; bad pictures are refused with one
//! line and nothing written.

mod common;

use common::{assert_close, golden, Expected};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-img2img-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `moss generate` on tiny-a, the CPU, the golden prompt and seed 42 (unless `args` give one), with `args`.
fn generate(args: &[&str]) -> Output {
    let exp = Expected::load("img2img_e2e");
    let model = golden().join("tiny-a");
    let prompt = exp.json["prompt"].as_str().unwrap().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["generate", "--device", "cpu", "--model", s(&model), "--prompt", &prompt])
        .args(if args.contains(&"--seed") || args.contains(&"--from") { &[][..] } else { &["--seed", "42"][..] })
        .args(args)
        .output()
        .unwrap();
    println!("moss generate {args:?}: {}\n  stderr: {}", o.status, String::from_utf8_lossy(&o.stderr).trim());
    o
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "moss failed: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// Failed with one line naming every string of `want`; `out` not written.
fn assert_refused(o: &Output, want: &[&str], out: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected a refusal, got success");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    for w in want {
        assert!(err.contains(w), "message does not name `{w}`: {err}");
    }
    assert!(!out.exists(), "{} was written despite the failure", out.display());
}

fn pixels(path: &Path) -> (Vec<u8>, u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (px, w, h, _) = moss::png::decode(&bytes).unwrap();
    (px, w, h)
}

fn expected(name: &str) -> PathBuf {
    golden().join("expected").join(name)
}

fn sha256(p: &Path) -> String {
    moss::pipeline::sha256_hex(&std::fs::read(p).unwrap())
}

fn settings(p: &Path) -> serde_json::Value {
    let meta = moss::picture_in::read_metadata(p).unwrap();
    serde_json::from_str(meta.get("moss").unwrap()).unwrap()
}

fn saved_latents(p: &Path) -> moss::tensor::Tensor {
    moss::pipeline::read_latents(p, 128, None).unwrap().0
}

/// The values off by more than one, and those off by one.
fn off(got: &[u8], want: &[u8]) -> (usize, usize) {
    let d: Vec<i32> = got.iter().zip(want).map(|(&a, &b)| (a as i32 - b as i32).abs()).collect();
    (d.iter().filter(|&&x| x > 1).count(), d.iter().filter(|&&x| x == 1).count())
}

/// The golden case `name`: its steps and strength.
fn case(exp: &Expected, name: &str) -> (String, String) {
    let c = exp.json["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap();
    (c["steps"].to_string(), c["strength"].to_string())
}

#[test]
fn img2img_matches_the_torch_reference() {
    let exp = Expected::load("img2img_e2e");
    let dir = scratch("plain");
    let (out, lat) = (dir.join("out.png"), dir.join("lat.safetensors"));
    let init = expected(exp.json["init_png"].as_str().unwrap());
    let (steps, strength) = case(&exp, "img2img");
    // No --size: the picture's own (64x64).
    ok(generate(&["--steps", &steps, "--init-image", s(&init), "--strength", &strength, "-o", s(&out), "--save-latents", s(&lat)]));
    let z = saved_latents(&lat);
    // The bound of tests/generate.rs (the encoder's bf16 rounding at the stage boundary).
    assert_close("img2img latents vs the torch reference", &z.data, &exp.tensor("img2img.latents").data, 1e-4);
    let (got, w, h) = pixels(&out);
    assert_eq!((w, h), (64, 64));
    let (big, ones) = off(&got, exp.raw("img2img.pixels"));
    assert!(big == 0 && ones <= 16, "img2img pixels: {big} off by more than one, {ones} by one");
    // The settings: the picture's sha256 and the strength; A1111's `Denoising strength`.
    let j = settings(&out);
    assert_eq!(j["init_image"]["sha256"], sha256(&init));
    assert_eq!(j["init_image"]["strength"].as_f64(), Some(0.6));
    assert!(j["init_image"].get("mask_sha256").is_none() && j["init_image"].get("mask_blur").is_none(), "{j}");
    let meta = moss::picture_in::read_metadata(&out).unwrap();
    assert!(meta.get("parameters").unwrap().contains("Denoising strength: 0.6,"));

    // --from: the same init image again gives the same bytes; none, or another, is refused.
    let again = dir.join("again.png");
    ok(generate(&["--from", s(&out), "--init-image", s(&init), "-o", s(&again)]));
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&out).unwrap(), "--from with the same init image differs");
    let other = dir.join("other.png");
    assert_refused(&generate(&["--from", s(&out), "-o", s(&other)]), &["--init-image", &sha256(&init)], &other);
    let wrong = expected("enc-48x80.png");
    assert_refused(&generate(&["--from", s(&out), "--init-image", s(&wrong), "-o", s(&other)]), &["not the picture"], &other);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inpainting_matches_the_torch_reference_and_keeps_the_input() {
    let exp = Expected::load("img2img_e2e");
    let dir = scratch("inpaint");
    let (out, lat) = (dir.join("out.png"), dir.join("lat.safetensors"));
    let init = expected(exp.json["init_png"].as_str().unwrap());
    let mask = expected("mask-64x64.png");
    let (steps, strength) = case(&exp, "inpaint");
    let blur = 2;
    ok(generate(&[
        "--steps",
        &steps,
        "--init-image",
        s(&init),
        "--mask",
        s(&mask),
        "--mask-blur",
        &blur.to_string(),
        "--strength",
        &strength,
        "-o",
        s(&out),
        "--save-latents",
        s(&lat),
    ]));
    let z = saved_latents(&lat);
    assert_close("inpaint latents vs the torch reference", &z.data, &exp.tensor("inpaint.latents").data, 1e-4);
    // Kept latent cells end on the encoded picture.
    let (m, z0) = (exp.tensor("mask.latent"), exp.tensor("z0"));
    assert!(m.data.contains(&0.0) && m.data.iter().any(|&v| v > 0.0 && v < 1.0), "the golden mask has kept and partial cells");
    assert_close("inpaint kept cells vs z0", &kept(&z.data, &m.data), &kept(&z0.data, &m.data), 1e-5);
    // The picture: the input's own pixels far (3 sigma + 2) from the mask's edge on the keep side,
    // the decoded latents far inside the repaint side.
    let (got, w, h) = pixels(&out);
    let (src, ..) = pixels(&init);
    let decoded = exp.raw("inpaint.pixels");
    let (mpx, ..) = grey(&mask);
    let r = 3 * blur + 2;
    let (mut kept_px, mut painted) = (0, 0);
    for y in 0..h as i64 {
        for x in 0..w as i64 {
            let near: Vec<bool> = (-r..=r)
                .flat_map(|dy| (-r..=r).map(move |dx| (y + dy, x + dx)))
                .filter(|&(yy, xx)| yy >= 0 && xx >= 0 && yy < h as i64 && xx < w as i64)
                .map(|(yy, xx)| mpx[(yy * w as i64 + xx) as usize] >= 128)
                .collect();
            let i = ((y * w as i64 + x) * 3) as usize;
            if near.iter().all(|&p| !p) {
                kept_px += 1;
                assert_eq!(&got[i..i + 3], &src[i..i + 3], "({x},{y}) far outside the mask is not the input's pixel");
            } else if near.iter().all(|&p| p) {
                painted += 1;
                let d = (0..3).map(|c| (got[i + c] as i32 - decoded[i + c] as i32).abs()).max().unwrap();
                assert!(d <= 1, "({x},{y}) far inside the mask is not the decoded pixel (off by {d})");
            }
        }
    }
    assert!(kept_px > 100 && painted > 20, "{kept_px} kept and {painted} painted pixels checked");
    let j = settings(&out);
    assert_eq!((j["init_image"]["mask_sha256"].as_str(), j["init_image"]["mask_blur"].as_u64()), (Some(sha256(&mask).as_str()), Some(2)));
    assert!(moss::picture_in::read_metadata(&out).unwrap().get("parameters").unwrap().contains("Denoising strength: 0.8, Mask blur: 2,"));
    // --from without the mask is refused.
    let other = dir.join("other.png");
    assert_refused(&generate(&["--from", s(&out), "--init-image", s(&init), "-o", s(&other)]), &["--mask"], &other);
    let _ = std::fs::remove_dir_all(&dir);
}

fn kept(v: &[f32], mask: &[f32]) -> Vec<f32> {
    let hw = mask.len();
    v.iter().enumerate().filter(|(i, _)| mask[i % hw] == 0.0).map(|(_, &x)| x).collect()
}

fn grey(p: &Path) -> (Vec<u8>, u32, u32) {
    let img = image::open(p).unwrap().to_luma8();
    let (w, h) = img.dimensions();
    (img.into_raw(), w, h)
}

fn write_png(p: &Path, img: image::DynamicImage) {
    img.save_with_format(p, image::ImageFormat::Png).unwrap();
}

/// Strength 1 runs the whole schedule from the seed's noise: text-to-image's pixels exactly.
#[test]
fn strength_one_is_text_to_image() {
    let dir = scratch("one");
    let (t2i, i2i) = (dir.join("t2i.png"), dir.join("i2i.png"));
    let init = expected("enc-64x64.png");
    ok(generate(&["--steps", "4", "--size", "64x64", "-o", s(&t2i)]));
    ok(generate(&["--steps", "4", "--init-image", s(&init), "--strength", "1", "-o", s(&i2i)]));
    assert!(pixels(&t2i) == pixels(&i2i), "strength 1 gives other pixels than text to image");
    assert!(std::fs::read(&t2i).unwrap() != std::fs::read(&i2i).unwrap(), "the metadata records the init image");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An all-black mask keeps everything: the input's pixels, byte for byte (any strength).
#[test]
fn an_all_keep_mask_returns_the_input() {
    let dir = scratch("keep");
    let (out, mask) = (dir.join("out.png"), dir.join("black.png"));
    let init = expected("enc-64x64.png");
    write_png(&mask, image::DynamicImage::ImageLuma8(image::GrayImage::new(64, 64)));
    ok(generate(&["--steps", "3", "--init-image", s(&init), "--mask", s(&mask), "--strength", "0.9", "-o", s(&out)]));
    assert!(pixels(&out).0 == pixels(&init).0, "an all-keep mask changed the picture");
    // The same mask as transparency: an opaque RGBA mask of any colour keeps everything too,
    // and a fully transparent one repaints everything (the alpha rule).
    let clear = dir.join("clear.png");
    write_png(&clear, image::DynamicImage::ImageRgba8(image::RgbaImage::new(64, 64)));
    let out2 = dir.join("out2.png");
    ok(generate(&["--steps", "3", "--init-image", s(&init), "--mask", s(&clear), "--strength", "0.9", "-o", s(&out2)]));
    let out3 = dir.join("out3.png");
    ok(generate(&["--steps", "3", "--init-image", s(&init), "--strength", "0.9", "-o", s(&out3)]));
    assert!(pixels(&out2).0 == pixels(&out3).0, "a transparent mask is not the whole picture repainted");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sizes_resize_and_outpaint() {
    let dir = scratch("sizes");
    let init = expected("enc-48x80.png"); // 48 wide, 80 high
    let out = dir.join("own.png");
    ok(generate(&["--steps", "2", "--init-image", s(&init), "--strength", "0.5", "-o", s(&out)]));
    assert_eq!((pixels(&out).1, pixels(&out).2), (48, 80), "without --size, the picture's own size");
    let out = dir.join("resized.png");
    ok(generate(&["--steps", "2", "--init-image", s(&init), "--strength", "0.5", "--size", "64x64", "-o", s(&out)]));
    assert_eq!((pixels(&out).1, pixels(&out).2), (64, 64));
    // Outpainting: the canvas is the picture plus the border; inside it (far from the border's
    // feather) the input's pixels stay.
    let out = dir.join("outpaint.png");
    ok(generate(&["--steps", "2", "--init-image", s(&init), "--outpaint", "16,0,16,16", "--mask-blur", "0", "-o", s(&out)]));
    let (got, w, h) = pixels(&out);
    assert_eq!((w, h), (80, 96));
    let (src, sw, sh) = pixels(&init);
    for y in 0..sh {
        for x in 0..sw {
            let (i, j) = (((y * w + x + 16) * 3) as usize, ((y * sw + x) * 3) as usize);
            assert_eq!(&got[i..i + 3], &src[j..j + 3], "({x},{y}) of the picture moved in the outpainted canvas");
        }
    }
    let j = settings(&out);
    assert_eq!((j["init_image"]["outpaint"].clone(), j["init_image"]["strength"].as_f64()), (serde_json::json!([16, 0, 16, 16]), Some(1.0)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hires_fix_renders_the_larger_picture() {
    let dir = scratch("hires");
    for up in ["latent", "lanczos"] {
        let out = dir.join(format!("{up}.png"));
        ok(generate(&["--steps", "2", "--size", "32x32", "--hires", "2", "--hires-steps", "3", "--hires-upscaler", up, "-o", s(&out)]));
        let (_, w, h) = pixels(&out);
        assert_eq!((w, h), (64, 64), "{up}");
        let p = moss::picture_in::read_metadata(&out).unwrap().get("parameters").unwrap().to_string();
        let label = if up == "latent" { "Latent" } else { "Lanczos" };
        assert!(p.contains("Size: 32x32") && p.contains(&format!("Hires upscale: 2, Hires resize: 64x64, Hires steps: 3, Hires upscaler: {label}")), "{p}");
        // --from renders it again.
        let again = dir.join(format!("{up}-again.png"));
        ok(generate(&["--from", s(&out), "-o", s(&again)]));
        assert!(std::fs::read(&again).unwrap() == std::fs::read(&out).unwrap(), "{up}: --from differs");
    }
    let out = dir.join("stray.png");
    assert_refused(&generate(&["--steps", "2", "--hires-steps", "3", "-o", s(&out)]), &["--hires-steps", "--hires"], &out);
    // The hires fix renders one picture at a time.
    let several = dir.join("p-{seed}.png");
    assert_refused(&generate(&["--steps", "2", "--size", "32x32", "--hires", "2", "--count", "2", "-o", s(&several)]), &["--hires", "--count"], &out);
    assert!(std::fs::read_dir(&dir).unwrap().all(|f| !f.unwrap().file_name().to_string_lossy().starts_with("p-")), "a picture was written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_pictures_are_refused() {
    let dir = scratch("bad");
    let out = dir.join("out.png");
    let init = expected("enc-64x64.png");
    let not = dir.join("not.png");
    std::fs::write(&not, b"hello, not a picture").unwrap();
    assert_refused(&generate(&["--init-image", s(&not), "-o", s(&out)]), &["--init-image", "not a PNG, JPEG or WebP picture"], &out);
    assert_refused(&generate(&["--init-image", s(&init), "--mask", s(&not), "-o", s(&out)]), &["--mask", "not a PNG, JPEG or WebP picture"], &out);
    let small = dir.join("small.png");
    write_png(&small, image::DynamicImage::ImageLuma8(image::GrayImage::new(32, 32)));
    assert_refused(&generate(&["--init-image", s(&init), "--mask", s(&small), "-o", s(&out)]), &["32x32", "64x64", "the init image's size"], &out);
    assert_refused(&generate(&["--strength", "0.5", "-o", s(&out)]), &["--strength", "--init-image"], &out);
    // A PNG whose header claims 100000x100000 (a decompression bomb's shape, no pixels behind
    // it): refused before any decoding, as the init image and as the mask.
    let bomb = dir.join("bomb.png");
    let mut bytes = std::io::Cursor::new(vec![]);
    image::DynamicImage::new_rgb8(1, 1).write_to(&mut bytes, image::ImageFormat::Png).unwrap();
    let mut bytes = bytes.into_inner();
    bytes[16..24].copy_from_slice(&[0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0]);
    let crc = crc32fast::hash(&bytes[12..29]);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(&bomb, &bytes).unwrap();
    assert_refused(&generate(&["--init-image", s(&bomb), "-o", s(&out)]), &["--init-image", "100000x100000"], &out);
    assert_refused(&generate(&["--init-image", s(&init), "--mask", s(&bomb), "-o", s(&out)]), &["--mask", "100000x100000"], &out);
    // clap's refusal (its usage lines follow).
    let o = generate(&["--init-image", s(&init), "--strength", "0", "-o", s(&out)]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("strength 0 is not in (0, 1]") && !out.exists());
    // An output may not be one of the pictures read; the picture is left as it was.
    let copy = dir.join("init.png");
    std::fs::copy(&init, &copy).unwrap();
    let o = generate(&["--steps", "1", "--init-image", s(&copy), "-o", s(&copy)]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("the init image"), "{o:?}");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&init).unwrap(), "the init image was overwritten");
    let m = dir.join("mask.png");
    write_png(&m, image::DynamicImage::ImageLuma8(image::GrayImage::new(64, 64)));
    let o = generate(&["--steps", "1", "--init-image", s(&init), "--mask", s(&m), "-o", s(&dir.join("x.png")), "--save-latents", s(&m)]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("the mask"), "{o:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Batch items with `init_image` (paths relative to the list) render `generate --init-image`'s
/// bytes; `--count` with an init image too; a path out of the list's folder is refused.
#[test]
fn batch_items_start_from_pictures() {
    let dir = scratch("batch");
    let lists = dir.join("lists");
    std::fs::create_dir_all(lists.join("pics")).unwrap();
    let init = expected("enc-64x64.png");
    let mask = expected("mask-64x64.png");
    std::fs::copy(&init, lists.join("pics/init.png")).unwrap();
    std::fs::copy(&mask, lists.join("pics/mask.png")).unwrap();
    std::fs::copy(&init, dir.join("outside.png")).unwrap();
    let exp = Expected::load("img2img_e2e");
    let prompt = exp.json["prompt"].as_str().unwrap();
    let list = [
        serde_json::json!({"prompt": prompt, "seed": 42, "steps": 3, "init_image": "pics/init.png", "strength": 0.6}),
        serde_json::json!({"prompt": prompt, "seed": 43, "steps": 3, "init_image": "pics/./init.png", "mask": "pics/mask.png", "mask_blur": 2}),
        serde_json::json!({"prompt": prompt, "seed": 44, "steps": 3, "init_image": "../outside.png"}),
        serde_json::json!({"prompt": prompt, "seed": 45, "steps": 3, "mask": "pics/mask.png"}),
    ];
    let text: String = list.iter().map(|l| l.to_string() + "\n").collect();
    std::fs::write(lists.join("list.jsonl"), text).unwrap();
    let out = dir.join("out");
    let model = golden().join("tiny-a");
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["generate", "--device", "cpu", "--model", s(&model), "--prompts", s(&lists.join("list.jsonl")), "--out-dir", s(&out)])
        .args(["--name", "{index}.png", "--strength", "0.9", "--quiet"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "two items are bad: {err}");
    assert!(err.contains("list.jsonl:3:") && err.contains("leaves the list's folder"), "{err}");
    assert!(err.contains("list.jsonl:4:") && err.contains("give `init_image`"), "{err}");
    let single = |args: &[&str], name: &str| {
        let p = dir.join(name);
        ok(generate(&[args, &["-o", s(&p)]].concat()));
        std::fs::read(p).unwrap()
    };
    let want0 = single(&["--seed", "42", "--steps", "3", "--init-image", s(&init), "--strength", "0.6"], "s0.png");
    // The second takes the batch's --strength 0.9.
    let want1 = single(&["--seed", "43", "--steps", "3", "--init-image", s(&init), "--mask", s(&mask), "--mask-blur", "2", "--strength", "0.9"], "s1.png");
    assert!(std::fs::read(out.join("0.png")).unwrap() == want0, "item 0 differs from generate --init-image");
    assert!(std::fs::read(out.join("1.png")).unwrap() == want1, "item 1 differs from generate --init-image --mask");
    assert!(!out.join("2.png").exists() && !out.join("3.png").exists());
    // --count over an init image: the same pictures as single runs of each seed.
    let several = dir.join("several");
    std::fs::create_dir_all(&several).unwrap();
    ok(generate(&["--steps", "3", "--init-image", s(&init), "--strength", "0.6", "--count", "2", "-o", s(&several.join("p-{seed}.png"))]));
    assert!(std::fs::read(several.join("p-42.png")).unwrap() == want0, "--count's first picture differs");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--sampler`, `--schedule` and `--guidance-window` with an init image (and a mask): the CLI's
/// latents are those of a host loop written here over the same DiT passes: the sampler over the
/// schedule's tail from `img2img::start_index`, started from the encoded picture noised to its
/// first sigma, the blend after every step with a mask, the window counting the tail's steps
/// (tests/img2img_samplers.rs pins that recipe to diffusers' pipelines). heun is refused with a
/// mask or an outpainting border.
#[test]
fn samplers_and_schedules_start_from_the_picture() {
    use moss::backend::cpu::Cpu;
    use moss::img2img::{self, Inpaint};
    use moss::model::dit::{Dit, MainLinears};
    use moss::noise::TorchGenerator;
    use moss::sampler::{self, Kind, ModelCall};
    use moss::sampling::in_window;
    use moss::sigmas::Schedule;
    use moss::tensor::Tensor;

    let dir = scratch("samplers");
    let model = golden().join("tiny-a");
    let (init, mask) = (expected("enc-64x64.png"), expected("mask-64x64.png"));
    let e = dir.join("embeds.safetensors");
    let o = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(["encode", "--model", s(&model), "--device", "cpu", "--prompt", "a lighthouse", "--negative", "fog", "--precision", "fp32", "-q", "-o", s(&e)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // The reference's pieces: the encoded picture, the mask at the latent grid, the passes.
    let ck = common::checkpoint("tiny-a");
    let rgb = image::open(&init).unwrap().to_rgb8().into_raw();
    let vae = ck.open_component("vae").unwrap();
    let encoder = moss::model::vae::VaeEncoder::load(&Cpu, &vae, &ck.vae).unwrap();
    let z0 = encoder.encode(&Cpu, &moss::model::vae::pixels_from_rgb8(&rgb, 64, 64).unwrap()).unwrap();
    let m = img2img::latent_mask(&grey(&mask).0, 64, 64, 4, 4).unwrap();
    let dit = Dit::load(&Cpu, &ck.open_component("transformer").unwrap(), &ck.dit, MainLinears::of(moss::options::Precision::Fp32)).unwrap();
    let emb = moss::embeds::read(&e).unwrap();
    let (tc, tu) = (dit.refine_text(&Cpu, &emb.cond.hidden).unwrap(), dit.refine_text(&Cpu, &emb.uncond.hidden).unwrap());
    let reference = |kind: Kind, schedule: Schedule, steps: usize, strength: f64, window: (f64, f64), masked: bool| -> Vec<f32> {
        let sigmas = schedule.sigmas(steps, &ck.scheduler).unwrap();
        let tail = &sigmas[img2img::start_index(steps, strength).unwrap()..];
        let mut gen = TorchGenerator::new(11);
        let noise = Tensor::new(z0.shape.clone(), gen.randn(z0.numel())).unwrap();
        let blend = masked.then(|| Inpaint::new(z0.clone(), noise.clone(), m.clone()).unwrap());
        let mut model = |x: &[f32], c: ModelCall| {
            let xt = Tensor::new(z0.shape.clone(), x.to_vec()).unwrap();
            let v_c = dit.velocity(&Cpu, &xt, c.t(), &tc, &[]).unwrap();
            if !in_window(c.step, c.steps, window) {
                return Ok(v_c.data);
            }
            let v_u = dit.velocity(&Cpu, &xt, c.t(), &tu, &[22]).unwrap();
            Ok(v_u.data.iter().zip(&v_c.data).map(|(&u, &c)| u + 3.0 * (c - u)).collect())
        };
        let after = |i: usize, x: Vec<f32>| match &blend {
            Some(p) => p.after_step_host(x, tail, i),
            None => Ok(x),
        };
        let start = img2img::noised(&z0, &noise, tail[0]).unwrap().data;
        sampler::run_with(kind, tail, start, &mut gen, &mut model, after, |_, _, _| Ok(())).unwrap().0
    };

    let cases = [
        (Kind::DpmPp2mSde, Schedule::Karras, 0.7, (0.0, 1.0), true),
        (Kind::Heun, Schedule::Model, 0.6, (0.0, 0.5), false),
        (Kind::UniPc, Schedule::Beta, 0.8, (0.0, 1.0), true),
        (Kind::EulerAncestral, Schedule::Simple, 0.5, (0.25, 1.0), false),
        (Kind::Euler, Schedule::Exponential, 0.9, (0.0, 1.0), true),
    ];
    let steps = 6;
    let mut finals = vec![];
    for (kind, schedule, strength, window, masked) in cases {
        let tag = format!("{kind}-{schedule}-{strength}");
        let (png, lat) = (dir.join(format!("{tag}.png")), dir.join(format!("{tag}.latents")));
        let (st, w) = (strength.to_string(), format!("{}:{}", window.0, window.1));
        let mut args = vec!["generate", "--model", s(&model), "--device", "cpu", "--embeds", s(&e), "--precision", "fp32", "--seed", "11", "--steps", "6"];
        args.extend(["--init-image", s(&init), "--strength", &st, "--sampler", kind.name(), "--schedule", schedule.name(), "--guidance-window", &w]);
        args.extend(["--json", "-o", s(&png), "--save-latents", s(&lat)]);
        if masked {
            args.extend(["--mask", s(&mask)]);
        }
        let o = Command::new(env!("CARGO_BIN_EXE_moss")).args(&args).output().unwrap();
        assert!(o.status.success(), "{tag}: {}", String::from_utf8_lossy(&o.stderr));
        let z = saved_latents(&lat);
        assert!(z.data == reference(kind, schedule, steps, strength, window, masked), "{tag}: the CLI's latents are not the host loop's");
        let j: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).unwrap();
        let run = steps - img2img::start_index(steps, strength).unwrap();
        assert_eq!(j["forwards"]["calls"], kind.calls(run), "{tag}: the tail's model calls");
        let p = moss::picture_in::read_metadata(&png).unwrap().get("parameters").unwrap().to_string();
        assert!(p.contains(&format!("Denoising strength: {strength}")), "{tag}: {p}");
        finals.push(z.data);
    }
    for (i, a) in finals.iter().enumerate() {
        assert!(finals[i + 1..].iter().all(|b| a != b), "two runs gave the same latents");
    }
    // heun does not inpaint or outpaint: one line, nothing written.
    let out = dir.join("heun.png");
    assert_refused(&generate(&["--init-image", s(&init), "--mask", s(&mask), "--sampler", "heun", "-o", s(&out)]), &["heun", "inpaint"], &out);
    assert_refused(&generate(&["--init-image", s(&init), "--outpaint", "16,0,0,0", "--sampler", "heun", "-o", s(&out)]), &["heun"], &out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--devices cpu,cpu` (CFG-parallel over two CPU ranks, byte-identical to one device for a
/// picture from text, tests/parallel.rs): every rank starts from the same picture and blends
/// alike, so inpainting with a stochastic sampler and the hires fix's second pass give one
/// device's bytes too.
#[test]
fn pictures_in_over_two_ranks_equal_one_device() {
    let dir = scratch("ranks");
    let (init, mask) = (expected("enc-64x64.png"), expected("mask-64x64.png"));
    let cases: [(&str, Vec<&str>); 2] = [
        ("inpaint", vec!["--steps", "4", "--init-image", s(&init), "--mask", s(&mask), "--strength", "0.8", "--sampler", "dpm++2m_sde"]),
        ("hires", vec!["--steps", "2", "--size", "32x32", "--hires", "2", "--hires-steps", "3", "--hires-upscaler", "lanczos"]),
    ];
    for (tag, args) in cases {
        let (one, two) = (dir.join(format!("{tag}-one.png")), dir.join(format!("{tag}-two.png")));
        ok(generate(&[&args[..], &["-o", s(&one)]].concat()));
        // `generate` passes --device cpu; --devices replaces it, so call the binary directly.
        let exp = Expected::load("img2img_e2e");
        let model = golden().join("tiny-a");
        let o = Command::new(env!("CARGO_BIN_EXE_moss"))
            .args(["generate", "--devices", "cpu,cpu", "--model", s(&model), "--prompt", exp.json["prompt"].as_str().unwrap(), "--seed", "42"])
            .args(&args)
            .args(["-o", s(&two)])
            .output()
            .unwrap();
        assert!(o.status.success(), "{tag}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(pixels(&one) == pixels(&two), "{tag}: two ranks give other pixels than one device");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
