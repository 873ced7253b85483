//! The signed C2PA manifest (`--c2pa-cert`, `--c2pa-key`). A throwaway CA and signing
//! certificates are made at test time with the openssl command line (an end-entity certificate
//! with the digitalSignature key usage and the emailProtection extended key usage, issued by a CA:
//! C2PA's certificate profile). Checked here: every refusal is one line before any model work with
//! nothing written; PNG, JPEG and WebP signed with ES256, Ed25519 and PS256 read back with the
//! `c2pa` crate's reader (valid, the test CA untrusted and nothing else failing, the created action
//! with trainedAlgorithmicMedia); the picture without its manifest is the unsigned picture byte for
//! byte; `generate`, `--count` and batch mode sign on the golden tiny-a, and `moss info` and
//! `--from` read the signed files. (tests/c2pa_verify.py checks the same with C2PA's Python reader,
//! and the server's pictures.)

mod common;

use moss::c2pa_manifest::ManifestSigner;
use moss::picture::Format;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TRAINED: &str = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia";

fn moss(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moss")).args(args).env_remove("MOSS_MODEL").output().unwrap()
}

fn ok(args: &[&str]) -> Vec<u8> {
    let o = moss(args);
    assert!(o.status.success(), "moss {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-c2pa-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl").args(args).current_dir(dir).output().expect("the openssl command line (Debian: openssl) makes the test certificates");
    assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// In `dir`: a CA (P-256) and, for each of `es256`, `ed25519`, `ps256`, a PKCS#8 key `NAME.key`
/// and its chain `NAME.pem` (the signing certificate, then the CA); `other.key`, a P-256 key of
/// no certificate; `self.pem`, a self-signed certificate of `es256.key`; `sec1.key`, `es256.key`
/// in the old SEC1 form; `noorg.pem`, a CA-issued certificate of `es256.key` without an O=.
fn make_certs(dir: &Path) {
    std::fs::write(
        dir.join("ee.ext"),
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=emailProtection\n\
         subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\n",
    )
    .unwrap();
    let ec = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"];
    openssl(dir, &[&ec[..], &["ca.key"]].concat());
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-sha256",
            "-days",
            "2",
            "-subj",
            "/O=moss tests/CN=moss test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            "ca.pem",
        ],
    );
    for name in ["es256", "ed25519", "ps256"] {
        let key = format!("{name}.key");
        match name {
            "es256" => openssl(dir, &[&ec[..], &[&key]].concat()),
            "ed25519" => openssl(dir, &["genpkey", "-algorithm", "ED25519", "-out", &key]),
            _ => openssl(dir, &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", &key]),
        }
        openssl(dir, &["req", "-new", "-key", &key, "-subj", &format!("/O=moss tests/CN=moss test signer {name}"), "-out", &format!("{name}.csr")]);
        let ee = format!("{name}.ee.pem");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "ee.ext",
                "-out",
                &ee,
            ],
        );
        let chain = [std::fs::read(dir.join(&ee)).unwrap(), std::fs::read(dir.join("ca.pem")).unwrap()].concat();
        std::fs::write(dir.join(format!("{name}.pem")), chain).unwrap();
    }
    openssl(dir, &[&ec[..], &["other.key"]].concat());
    openssl(dir, &["req", "-x509", "-new", "-key", "es256.key", "-sha256", "-days", "2", "-subj", "/O=moss tests/CN=moss self-signed", "-out", "self.pem"]);
    openssl(dir, &["ec", "-in", "es256.key", "-out", "sec1.key"]);
    // A signing certificate of es256.key whose subject names no organization.
    openssl(dir, &["req", "-new", "-key", "es256.key", "-subj", "/CN=moss no organization", "-out", "noorg.csr"]);
    openssl(
        dir,
        &["x509", "-req", "-in", "noorg.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-extfile", "ee.ext", "-out", "noorg.pem"],
    );
}

fn p(d: &Path, name: &str) -> String {
    d.join(name).display().to_string()
}

fn tiny() -> String {
    common::golden().join("tiny-a").display().to_string()
}

fn generate<'a>(model: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "generate",
        "--device",
        "cpu",
        "--model",
        model,
        "--prompt",
        "a lighthouse at dusk",
        "--seed",
        "21",
        "--steps",
        "2",
        "--size",
        "64x48",
        "-q",
        "-o",
        out,
    ]
}

/// The manifest store as the `c2pa` crate's reader reports it (its JSON).
fn manifest_store(bytes: &[u8], format: Format) -> Value {
    let mime = moss::c2pa_manifest::mime(format);
    let r = c2pa::Reader::from_context(c2pa::Context::new())
        .with_stream(mime, std::io::Cursor::new(bytes.to_vec()))
        .unwrap_or_else(|e| panic!("no manifest in the {}: {e}", format.name()));
    serde_json::from_str(&r.json()).unwrap()
}

fn codes(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().map(|s| s["code"].as_str().unwrap_or("").to_string()).collect()).unwrap_or_default()
}

/// The manifest is there, valid but for the test CA, and says what moss signs: the title, moss
/// as claim generator, one `c2pa.created` action with trainedAlgorithmicMedia and moss as agent.
fn check_manifest(bytes: &[u8], format: Format, title: &str, alg: &str) {
    let store = manifest_store(bytes, format);
    let what = format!("{} ({alg})", format.name());
    assert_eq!(store["validation_state"], "Valid", "{what}: {store:#}");
    let results = &store["validation_results"]["activeManifest"];
    assert_eq!(codes(&results["failure"]), ["signingCredential.untrusted"], "{what}: only the test CA is untrusted");
    let success = codes(&results["success"]);
    for code in ["claimSignature.validated", "claimSignature.insideValidity", "assertion.dataHash.match"] {
        assert!(success.iter().any(|c| c == code), "{what}: no {code} in {success:?}");
    }
    let m = &store["manifests"][store["active_manifest"].as_str().unwrap()];
    assert_eq!(m["title"], title, "{what}");
    assert_eq!(m["claim_generator_info"][0]["name"], "moss", "{what}");
    assert_eq!(m["claim_generator_info"][0]["version"], env!("CARGO_PKG_VERSION"), "{what}");
    assert_eq!(m["signature_info"]["alg"].as_str().map(str::to_ascii_lowercase).as_deref(), Some(alg), "{what}");
    let actions: Vec<&Value> = m["assertions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["label"].as_str().is_some_and(|l| l.starts_with("c2pa.actions")))
        .flat_map(|a| a["data"]["actions"].as_array().unwrap())
        .collect();
    assert_eq!(actions.len(), 1, "{what}: {actions:?}");
    assert_eq!(actions[0]["action"], "c2pa.created", "{what}");
    assert_eq!(actions[0]["digitalSourceType"], TRAINED, "{what}");
    assert_eq!(actions[0]["softwareAgent"]["name"], "moss", "{what}");
}

/// The picture without the C2PA manifest: a PNG's `caBX` chunk, a JPEG's APP11 segments, a
/// WebP's `C2PA` chunk taken out (by img-parts).
fn without_manifest(bytes: &[u8]) -> Vec<u8> {
    match moss::picture::sniff(bytes).unwrap() {
        Format::Png => {
            let mut png = img_parts::png::Png::from_bytes(bytes.to_vec().into()).unwrap();
            png.remove_chunks_by_type(*b"caBX");
            png.encoder().bytes().to_vec()
        }
        Format::Jpeg => {
            let mut jpg = img_parts::jpeg::Jpeg::from_bytes(bytes.to_vec().into()).unwrap();
            jpg.remove_segments_by_marker(img_parts::jpeg::markers::APP11);
            jpg.encoder().bytes().to_vec()
        }
        Format::Webp => {
            let mut webp = img_parts::webp::WebP::from_bytes(bytes.to_vec().into()).unwrap();
            webp.remove_chunks_by_id(*b"C2PA");
            webp.encoder().bytes().to_vec()
        }
    }
}

/// Exit 1 with one `moss: error:` line containing each of `needles`, nothing on stdout.
fn refused(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected a refusal: {err}");
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    for n in needles {
        assert!(lines[0].starts_with("moss: error:") && lines[0].contains(n), "{n:?} not in: {err}");
    }
    assert!(o.stdout.is_empty());
}

/// One flag alone, a file that does not read, a key of another certificate, a self-signed
/// certificate, one without an organization, a key in the old SEC1 form, a certificate file
/// without a certificate: each one
/// line, said before the model is opened (the model named does not exist), nothing written; the
/// same for batch mode and the server.
#[test]
fn refusals_come_first_and_write_nothing() {
    let d = scratch("refuse");
    make_certs(&d);
    let out = p(&d, "out.png");
    let nowhere = p(&d, "no-such-model");
    let (chain, key) = (p(&d, "es256.pem"), p(&d, "es256.key"));
    let missing = p(&d, "missing.pem");
    let (other, ed_chain, self_signed, sec1) = (p(&d, "other.key"), p(&d, "ed25519.pem"), p(&d, "self.pem"), p(&d, "sec1.key"));
    let noorg = p(&d, "noorg.pem");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["--c2pa-cert", &chain], vec!["--c2pa-cert needs --c2pa-key"]),
        (vec!["--c2pa-key", &key], vec!["--c2pa-key needs --c2pa-cert"]),
        (vec!["--c2pa-cert", &missing, "--c2pa-key", &key], vec!["--c2pa-cert", "missing.pem", "cannot read it"]),
        (vec!["--c2pa-cert", &chain, "--c2pa-key", &missing], vec!["--c2pa-key", "missing.pem", "cannot read it"]),
        (vec!["--c2pa-cert", &chain, "--c2pa-key", "/work"], vec!["--c2pa-key /work: cannot read it"]),
        (vec!["--c2pa-cert", &chain, "--c2pa-key", &other], vec!["other.key does not match --c2pa-cert", "es256.pem"]),
        (vec!["--c2pa-cert", &ed_chain, "--c2pa-key", &key], vec!["does not match"]),
        (vec!["--c2pa-cert", &self_signed, "--c2pa-key", &key], vec!["self.pem: the C2PA signature is refused", "not self-signed"]),
        (vec!["--c2pa-cert", &chain, "--c2pa-key", &sec1], vec!["sec1.key: the key is in the old EC PRIVATE KEY form", "PKCS#8"]),
        (vec!["--c2pa-cert", &noorg, "--c2pa-key", &key], vec!["noorg.pem: the signing certificate's subject has no organization"]),
        (vec!["--c2pa-cert", &key, "--c2pa-key", &key], vec!["--c2pa-cert", "no certificate in it"]),
        (vec!["--c2pa-cert", &chain, "--c2pa-key", &chain], vec!["--c2pa-key", "no private key in it"]),
    ];
    for (flags, needles) in &cases {
        let o = moss(&[&generate(&nowhere, &out)[..], flags].concat());
        refused(&o, needles);
        assert!(!Path::new(&out).exists(), "{flags:?} wrote {out}");
    }
    // Batch mode, and several seeds of one prompt (batch mode underneath).
    let list = p(&d, "list.txt");
    std::fs::write(&list, "a fox\na cat\n").unwrap();
    let outdir = p(&d, "batch");
    let batch = ["generate", "--device", "cpu", "--model", &nowhere, "--prompts", &list, "--out-dir", &outdir, "--steps", "2", "--size", "64x48", "-q"];
    refused(&moss(&[&batch[..], &["--c2pa-cert", &chain]].concat()), &["--c2pa-cert needs --c2pa-key"]);
    refused(&moss(&[&batch[..], &["--c2pa-cert", &chain, "--c2pa-key", &p(&d, "other.key")]].concat()), &["does not match"]);
    let seeds = p(&d, "s-{seed}.png");
    refused(&moss(&[&generate(&nowhere, &seeds)[..], &["--count", "2", "--c2pa-key", &key]].concat()), &["--c2pa-key needs --c2pa-cert"]);
    assert!(!Path::new(&outdir).exists() && std::fs::read_dir(&d).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with("s-")));
    // The server: refused before it listens.
    let serve = ["serve", "--device", "cpu", "--model", &nowhere, "--port", "0"];
    refused(&moss(&[&serve[..], &["--c2pa-key", &key]].concat()), &["--c2pa-key needs --c2pa-cert"]);
    refused(&moss(&[&serve[..], &["--c2pa-cert", &chain, "--c2pa-key", &p(&d, "other.key")]].concat()), &["does not match"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// Each algorithm signs each format; the `c2pa` crate reads a valid manifest back; the picture
/// without it is the unsigned one, byte for byte (so moss's metadata and pixels are untouched).
#[test]
fn every_algorithm_signs_every_format() {
    let d = scratch("lib");
    make_certs(&d);
    let (w, h) = (48u32, 32u32);
    let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
    let mut meta = moss::png::Metadata::default();
    meta.push("parameters", "a fox\nSteps: 2, Seed: 7");
    meta.push("Software", moss::metadata::version());
    for alg in ["es256", "ed25519", "ps256"] {
        let s = ManifestSigner::from_files(&d.join(format!("{alg}.pem")), &d.join(format!("{alg}.key"))).unwrap();
        assert_eq!(s.alg().to_string(), alg);
        for name in ["fox.png", "fox.jpg", "fox.webp"] {
            let format = Format::of(Path::new(name)).unwrap();
            let plain = moss::picture::encode(Path::new(name), None, &rgb, w, h, &meta).unwrap().bytes;
            let signed = s.sign(&plain, format, name).unwrap();
            check_manifest(&signed, format, name, alg);
            assert!(without_manifest(&signed) == plain, "{name} ({alg}): the picture without its manifest is not the unsigned one");
            let (px, gw, gh, m) = moss::picture::decode(&signed).unwrap();
            let (want_px, _, _, want_m) = moss::picture::decode(&plain).unwrap();
            assert!((gw, gh) == (w, h) && px == want_px, "{name} ({alg}): other pixels");
            assert_eq!(m, want_m, "{name} ({alg}): other metadata");
        }
    }
    // A picture changed after signing fails the data hash.
    let s = ManifestSigner::from_files(&d.join("es256.pem"), &d.join("es256.key")).unwrap();
    let mut signed = s.sign(&moss::picture::encode(Path::new("a.png"), None, &rgb, w, h, &meta).unwrap().bytes, Format::Png, "a.png").unwrap();
    let n = signed.len();
    signed[n - 20] ^= 1; // inside IDAT, before IEND
    let store = manifest_store(&signed, Format::Png);
    assert_eq!(store["validation_state"], "Invalid", "a changed picture still validates");
    assert!(codes(&store["validation_results"]["activeManifest"]["failure"]).iter().any(|c| c == "assertion.dataHash.mismatch"));
    let _ = std::fs::remove_dir_all(&d);
}

/// `generate` (PNG, JPEG, WebP), `--count` and batch mode sign on the golden tiny-a: a valid
/// manifest titled with the file's name; without it, the picture `generate` writes unsigned;
/// `moss info` reads the same settings; `--from` a signed file renders the unsigned PNG again.
#[test]
fn generate_and_batch_sign_their_pictures() {
    let d = scratch("gen");
    make_certs(&d);
    let m = tiny();
    let flags = ["--c2pa-cert".to_string(), p(&d, "es256.pem"), "--c2pa-key".to_string(), p(&d, "es256.key")];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    for ext in ["png", "jpg", "webp"] {
        let (plain, signed) = (p(&d, &format!("plain.{ext}")), p(&d, &format!("signed.{ext}")));
        ok(&generate(&m, &plain));
        ok(&[&generate(&m, &signed)[..], &flags].concat());
        let (a, b) = (std::fs::read(&plain).unwrap(), std::fs::read(&signed).unwrap());
        let format = Format::of(Path::new(&signed)).unwrap();
        check_manifest(&b, format, &format!("signed.{ext}"), "es256");
        assert!(without_manifest(&b) == a, "{ext}: the signed picture without its manifest is not the unsigned one");
        assert_eq!(ok(&["info", &signed]), ok(&["info", &plain]), "{ext}: moss info");
        let again = p(&d, &format!("again-{ext}.png"));
        ok(&["generate", "--device", "cpu", "--model", &m, "--from", &signed, "-q", "-o", &again]);
        assert!(std::fs::read(&again).unwrap() == std::fs::read(p(&d, "plain.png")).unwrap(), "--from signed.{ext}");
    }
    // Several seeds of one prompt, and a list: every picture signed, titled with its own name.
    ok(&[&generate(&m, &p(&d, "s-{seed}.png"))[..], &["--count", "2"], &flags].concat());
    let list = p(&d, "list.txt");
    std::fs::write(&list, "a fox\n{\"prompt\": \"a cat\", \"out\": \"cat.webp\"}\n").unwrap();
    let outdir = p(&d, "batch");
    ok(&[&["generate", "--device", "cpu", "--model", &m, "--prompts", &list, "--out-dir", &outdir, "--steps", "2", "--size", "64x48", "-q"][..], &flags]
        .concat());
    let mut names: Vec<(PathBuf, String)> = ["s-21.png", "s-22.png"].iter().map(|n| (d.join(n), n.to_string())).collect();
    for e in std::fs::read_dir(&outdir).unwrap() {
        let e = e.unwrap();
        names.push((e.path(), e.file_name().to_string_lossy().into_owned()));
    }
    assert_eq!(names.len(), 4, "{names:?}");
    for (path, name) in names {
        check_manifest(&std::fs::read(&path).unwrap(), Format::of(&path).unwrap(), &name, "es256");
    }
    let _ = std::fs::remove_dir_all(&d);
}
