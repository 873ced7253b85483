//! `moss generate --prompts` on the golden checkpoints (CPU), through the binary: the list
//! formats (plain text, JSON Lines, both mixed, stdin), per-line overrides of the flags, naming,
//! `--skip-existing`, `--shard` (the shards together render each item exactly once), bad lines
//! (reported with their line number and skipped, exit 1), chunking, and Ctrl-C. Every batch
//! picture is compared byte for byte with what a single `moss generate` renders for the same
//! prompt and settings (pixels and metadata), so the batch path cannot drift from it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn moss_in(args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moss"))
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(data) = stdin {
        child.stdin.take().unwrap().write_all(data).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn moss(args: &[&str]) -> Run {
    moss_in(args, None)
}

fn ok(args: &[&str]) -> Run {
    let r = moss(args);
    assert_eq!(r.code, 0, "moss {args:?} failed: {}", r.stderr);
    r
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moss-batch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn model(name: &str) -> String {
    common::golden().join(name).to_str().unwrap().to_string()
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// Every file under `dir` (relative names), recursively.
fn files(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, d: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.insert(p.strip_prefix(base).unwrap().to_str().unwrap().to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// `--flag value` pairs with a later pair replacing an earlier one of the same flag.
fn merged<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    let mut pairs: Vec<(&str, &str)> = vec![];
    for kv in flags.chunks(2) {
        match pairs.iter_mut().find(|p| p.0 == kv[0]) {
            Some(p) => p.1 = kv[1],
            None => pairs.push((kv[0], kv[1])),
        }
    }
    pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()
}

/// What a single `moss generate` writes for these flags (on top of device, model and out; a
/// later `--flag value` replaces an earlier one).
fn single(model: &str, tag: &str, flags: &[&str]) -> Vec<u8> {
    let dir = scratch(&format!("single-{tag}"));
    let out = dir.join("one.png");
    let mut args = vec!["generate", "--device", "cpu", "--model", model, "--out", out.to_str().unwrap()];
    args.extend(merged(flags));
    ok(&args);
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// A setting from the picture's `moss` metadata chunk.
fn meta(bytes: &[u8], key: &str) -> String {
    let (_, _, _, m) = moss::png::decode(bytes).unwrap();
    let j: serde_json::Value = serde_json::from_str(m.get("moss").expect("no moss chunk in the PNG")).unwrap();
    match &j[key] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => panic!("no {key} in the PNG's moss settings"),
        v => v.to_string(),
    }
}

fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"))).collect()
}

fn write(dir: &Path, name: &str, text: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    s(&p)
}

#[test]
fn plain_list_renders_what_single_generate_renders() {
    let dir = scratch("plain");
    let m = model("tiny-a");
    // Blank lines are no items; outer whitespace is trimmed; a repeated prompt is encoded once
    // per chunk but each item keeps its own seed.
    let list = write(&dir, "list.txt", b"a cat\n\n   \n  a red boat  \r\na cat\n");
    let out = dir.join("out");
    let flags = ["--seed", "10", "--steps", "2", "--size", "64x64"];
    let mut args = vec!["generate", "--device", "cpu", "--model", &m, "--prompts", &list];
    args.extend_from_slice(&flags);
    let o = s(&out);
    let r = ok(&[&args[..], &["--out-dir", &o]].concat());
    let names = ["00000-10.png", "00001-11.png", "00002-12.png"];
    let want: Vec<String> = names.iter().map(|n| format!("{}\n", out.join(n).display())).collect();
    assert_eq!(r.stdout, want.concat(), "stdout lists the written pictures in order");
    assert!(r.stderr.is_empty(), "stderr not empty when not a terminal: {:?}", r.stderr);
    assert_eq!(files(&out), set(&names), "exactly the pictures, no partial files");

    for (n, (prompt, seed)) in names.iter().zip([("a cat", "10"), ("a red boat", "11"), ("a cat", "12")]) {
        let got = std::fs::read(out.join(n)).unwrap();
        let want = single(&m, &format!("plain-{n}"), &[&flags[..], &["--prompt", prompt, "--seed", seed]].concat());
        assert!(got == want, "{n}: the batch picture differs from `moss generate --prompt {prompt:?} --seed {seed}`");
        assert_eq!(meta(&got, "prompt"), prompt);
        assert_eq!(meta(&got, "seed"), seed);
    }
    assert!(std::fs::read(out.join(names[0])).unwrap() != std::fs::read(out.join(names[2])).unwrap(), "seeds differ");

    // Chunks of 2 (encode, free, denoise, decode, twice): the same bytes.
    let o2 = s(&dir.join("chunked"));
    ok(&[&args[..], &["--out-dir", &o2, "--chunk", "2"]].concat());
    for n in names {
        assert!(std::fs::read(out.join(n)).unwrap() == std::fs::read(dir.join("chunked").join(n)).unwrap(), "{n}: --chunk 2 differs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_lines_override_the_flags() {
    let dir = scratch("jsonl");
    let m = model("tiny-b");
    let text = concat!(
        r#"{"prompt": "a dog", "seed": 5, "size": "64x96", "steps": 1, "guidance": 1, "out": "dog-{seed}.png"}"#,
        "\n",
        r#"{"prompt": "a fox", "negative": "blurry", "guidance": 4.5}"#,
        "\n",
        "a plain line between JSON lines\n",
        r#"  {"steps": 3, "prompt": "an owl", "negative": null, "out": "sub/{stem}-{index}.png"}"#,
        "\n"
    );
    let list = write(&dir, "list.jsonl", text.as_bytes());
    let defaults = ["--seed", "100", "--steps", "2", "--size", "96x64", "--negative", "low quality", "--guidance", "2.5"];
    let o = s(&dir.join("out"));
    let base = [&["generate", "--device", "cpu", "--model", &m][..], &defaults[..]].concat();
    let r = ok(&[&base[..], &["--prompts", &list, "--out-dir", &o, "--json"]].concat());
    let js = json_lines(&r.stdout);
    assert_eq!(js.len(), 4, "one JSON line per picture: {}", r.stdout);
    let names = ["dog-5.png", "00001-101.png", "00002-102.png", "sub/an-owl-3.png"];
    assert_eq!(files(&dir.join("out")), set(&names));
    for (j, (n, (idx, line, seed, steps, w, h))) in
        js.iter().zip(names.iter().zip([(0, 1, 5, 1, 64, 96), (1, 2, 101, 2, 96, 64), (2, 3, 102, 2, 96, 64), (3, 4, 103, 3, 96, 64)]))
    {
        assert_eq!(j["path"].as_str().unwrap(), dir.join("out").join(n).to_str().unwrap(), "{j}");
        let got: Vec<u64> = ["index", "line", "seed", "steps", "width", "height"].iter().map(|k| j[k].as_u64().unwrap()).collect();
        assert_eq!(got, vec![idx, line, seed, steps, w, h], "{j}");
        for k in ["encode_s", "denoise_s", "decode_s", "total_s"] {
            assert!(j["timings"][k].as_f64().is_some(), "{j} lacks timings.{k}");
        }
    }
    // Each picture equals the single render with the line's values and the flags' defaults.
    let want = [
        ("dog", vec!["--prompt", "a dog", "--seed", "5", "--size", "64x96", "--steps", "1", "--guidance", "1"]),
        ("fox", vec!["--prompt", "a fox", "--seed", "101", "--negative", "blurry", "--guidance", "4.5"]),
        ("plain", vec!["--prompt", "a plain line between JSON lines", "--seed", "102"]),
        ("owl", vec!["--prompt", "an owl", "--seed", "103", "--steps", "3"]),
    ];
    for (n, (tag, flags)) in names.iter().zip(want) {
        let mut f: Vec<&str> = defaults.to_vec();
        f.extend(flags); // the line's values replace the defaults
        let got = std::fs::read(dir.join("out").join(n)).unwrap();
        assert!(got == single(&m, tag, &f), "{n}: differs from single generate with {f:?}");
    }
    assert_eq!(meta(&std::fs::read(dir.join("out").join(names[1])).unwrap(), "negative"), "blurry");
    assert_eq!(meta(&std::fs::read(dir.join("out").join(names[2])).unwrap(), "negative"), "low quality");

    // The same list on stdin (`--prompts -`) gives the same files.
    let o2 = s(&dir.join("stdin"));
    let r = moss_in(&[&base[..], &["--prompts", "-", "--out-dir", &o2]].concat(), Some(text.as_bytes()));
    assert_eq!(r.code, 0, "{}", r.stderr);
    for n in names {
        assert!(std::fs::read(dir.join("out").join(n)).unwrap() == std::fs::read(dir.join("stdin").join(n)).unwrap(), "{n} via stdin");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn name_templates() {
    let dir = scratch("names");
    let m = model("tiny-a");
    let list = write(&dir, "l.txt", b"A Cat, on a MAT!\n\n{\"prompt\": \"x\", \"seed\": 7}\n");
    let o = s(&dir.join("out"));
    let base = ["generate", "--device", "cpu", "--model", &m, "--steps", "1", "--size", "64x64", "--prompts", &list, "--out-dir", &o];
    ok(&[&base[..], &["--name", "{{{line:03}}}_{stem:8}_{seed:06}_{index}.png"]].concat());
    assert_eq!(files(&dir.join("out")), set(&["{001}_a-cat-on_000042_0.png", "{003}_x_000007_1.png"]));

    // A template error is refused before any work, on one line.
    for (tpl, needle) in [("{idx}.png", "unknown field `{idx}`"), ("{index.png", "not closed"), ("{seed:7}.png", ":0N")] {
        let out = dir.join("bad");
        let r = moss(&["generate", "--device", "cpu", "--model", &m, "--prompts", &list, "--out-dir", &s(&out), "--name", tpl]);
        assert_eq!(r.code, 1, "{tpl}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{tpl}: {:?}", r.stderr);
        assert!(r.stderr.contains(needle) && r.stderr.contains("--name"), "{tpl}: {:?}", r.stderr);
        assert!(!out.exists() || files(&out).is_empty(), "{tpl}: wrote something");
    }

    // Two items naming one file: the first is written, the later one fails and says why.
    let o = s(&dir.join("clash"));
    let r = moss(&[&base[..11], &["--out-dir", &o, "--name", "same.png"]].concat());
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains(":3: output") && r.stderr.contains("already line 1's"), "{:?}", r.stderr);
    assert_eq!(files(&dir.join("clash")), set(&["same.png"]));
    assert_eq!(meta(&std::fs::read(dir.join("clash/same.png")).unwrap(), "prompt"), "A Cat, on a MAT!");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn skip_existing_renders_only_what_is_missing() {
    let dir = scratch("skip");
    let m = model("tiny-a");
    let list = write(&dir, "l.txt", b"one\ntwo\nthree\nfour\n");
    let out = dir.join("out");
    let o = s(&out);
    let args = ["generate", "--device", "cpu", "--model", &m, "--steps", "1", "--size", "64x64", "--prompts", &list, "--out-dir", &o];
    ok(&args);
    let names = ["00000-42.png", "00001-43.png", "00002-44.png", "00003-45.png"];
    assert_eq!(files(&out), set(&names));
    let orig: Vec<Vec<u8>> = names.iter().map(|n| std::fs::read(out.join(n)).unwrap()).collect();
    // As if the job had been killed: two pictures missing, and one file that must not be touched.
    std::fs::remove_file(out.join(names[1])).unwrap();
    std::fs::remove_file(out.join(names[3])).unwrap();
    std::fs::write(out.join(names[2]), b"not rendered by this run").unwrap();

    let r = ok(&[&args[..], &["--skip-existing", "--json"]].concat());
    let done: Vec<String> = json_lines(&r.stdout).iter().map(|j| j["path"].as_str().unwrap().to_string()).collect();
    assert_eq!(done, [s(&out.join(names[1])), s(&out.join(names[3]))], "only the missing ones are rendered");
    assert!(r.stderr.is_empty(), "{:?}", r.stderr);
    assert_eq!(std::fs::read(out.join(names[2])).unwrap(), b"not rendered by this run");
    for i in [0, 1, 3] {
        assert!(std::fs::read(out.join(names[i])).unwrap() == orig[i], "{}: differs after resuming", names[i]);
    }
    // Nothing missing: nothing rendered, exit 0.
    let r = ok(&[&args[..], &["--skip-existing"]].concat());
    assert!(r.stdout.is_empty(), "{:?}", r.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shards_render_each_item_exactly_once() {
    let dir = scratch("shard");
    let m = model("tiny-a");
    // 8 items; index 3 is a bad line (shard 0 of 3 owns it), index 5 sets its own seed.
    let text = b"p0\np1\n\np2\n{\"prompt\": \"p3\", \"size\": \"50x64\"}\np4\n{\"prompt\": \"p5\", \"seed\": 9}\np6\np7\n";
    let list = write(&dir, "l.txt", text);
    let base = ["generate", "--device", "cpu", "--model", &m, "--steps", "1", "--size", "64x64", "--prompts", &list];
    let all = dir.join("all");
    let r = moss(&[&base[..], &["--out-dir", &s(&all)]].concat());
    assert_eq!(r.code, 1, "{}", r.stderr);
    let reference = files(&all);
    assert_eq!(reference.len(), 7, "{reference:?}");
    assert!(reference.contains("00005-9.png") && reference.contains("00006-48.png"), "{reference:?}");

    let n = 3;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for k in 0..n {
        let out = dir.join(format!("shard{k}"));
        let shard = format!("{k}/{n}");
        let r = moss(&[&base[..], &["--out-dir", &s(&out), "--shard", &shard, "--json"]].concat());
        // Only the shard that owns the bad line reports it and fails.
        let reports = r.stderr.matches(":5: width 50").count();
        assert_eq!(reports, usize::from(k == 0), "shard {shard}: {:?}", r.stderr);
        assert_eq!(r.code, if k == 0 { 1 } else { 0 }, "shard {shard}: {}", r.stderr);
        for j in json_lines(&r.stdout) {
            assert_eq!(j["index"].as_u64().unwrap() % n as u64, k as u64, "shard {shard} rendered {j}");
        }
        for f in files(&out) {
            let a = std::fs::read(out.join(&f)).unwrap();
            let b = std::fs::read(all.join(&f)).unwrap_or_else(|_| panic!("shard {shard} wrote {f}, which the whole list does not have"));
            assert!(a == b, "shard {shard}: {f} differs from the unsharded render");
            *seen.entry(f).or_default() += 1;
        }
    }
    let once: BTreeSet<String> = seen.iter().filter(|e| *e.1 == 1).map(|e| e.0.clone()).collect();
    assert_eq!(once, reference, "each item exactly once over the {n} shards: {seen:?}");
    assert!(seen.values().all(|&c| c == 1), "{seen:?}");

    for (bad, needle) in [("3/3", "counts from 0"), ("0/0", "at least 1"), ("1-3", "K/N")] {
        let r = moss(&[&base[..], &["--shard", bad]].concat());
        assert_eq!(r.code, 2, "{bad}");
        // clap's whole message: the problem first, then where to look.
        assert!(r.stderr.lines().next().unwrap_or("").contains(needle) && r.stderr.contains("--help"), "{bad}: {:?}", r.stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_lines_are_reported_and_skipped() {
    let dir = scratch("bad");
    let m = model("tiny-a");
    let mut text = Vec::new();
    text.extend_from_slice(b"a good line\n"); // line 1, index 0
    text.extend_from_slice(b"{\"prompt\": \"x\",\n"); // 2: invalid JSON
    text.extend_from_slice(b"{\"prompt\": \"x\", \"size\": \"1000x64\"}\n"); // 3: bad size
    text.extend_from_slice(b"{\"prompt\": \"x\", \"sede\": 3}\n"); // 4: unknown field
    text.extend_from_slice(b"{\"prompt\": \"x\", \"steps\": 0}\n"); // 5: bad steps
    text.extend_from_slice(b"caf\xe9 latin-1\n"); // 6: not UTF-8
    text.extend_from_slice(b"\n"); // 7: blank, no item
    text.extend_from_slice(b"{\"seed\": 3}\n"); // 8: no prompt
    text.extend_from_slice(b"another good line"); // 9, index 7, no final newline
    let list = write(&dir, "list.txt", &text);
    let out = dir.join("out");
    let r = moss(&["generate", "--device", "cpu", "--model", &m, "--steps", "1", "--size", "64x64", "--prompts", &list, "--out-dir", &s(&out)]);
    assert_eq!(r.code, 1, "exit code: {}", r.stderr);
    for (line, needle) in [(2, "invalid JSON"), (3, "multiple of 16"), (4, "unknown field `sede`"), (5, "steps 0"), (6, "UTF-8"), (8, "no `prompt`")] {
        let want = format!("{list}:{line}: ");
        let hits: Vec<&str> = r.stderr.lines().filter(|l| l.contains(&want)).collect();
        assert_eq!(hits.len(), 1, "line {line} reported once: {:?}", r.stderr);
        assert!(hits[0].contains(needle), "line {line}: {:?} lacks {needle:?}", hits[0]);
    }
    assert!(r.stderr.lines().last().unwrap().contains("2 written, 6 failed"), "{:?}", r.stderr);
    // Bad lines keep their index: the last good line is item 7, seed 42 + 7.
    assert_eq!(files(&out), set(&["00000-42.png", "00007-49.png"]));
    assert_eq!(r.stdout.lines().count(), 2, "{:?}", r.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ctrl_c_stops_after_the_step_and_resumes() {
    let dir = scratch("sigint");
    let m = model("tiny-a");
    let list = write(&dir, "l.txt", b"p0\np1\np2\np3\np4\np5\n");
    let out = dir.join("out");
    let args =
        ["generate", "--device", "cpu", "--model", &m, "--steps", "6", "--size", "64x64", "--prompts", &list, "--out-dir", &s(&out), "--chunk", "1", "--json"];
    let mut child = Command::new(env!("CARGO_BIN_EXE_moss")).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("00000-42.png"), "{first:?}");
    // The first picture is out; the second chunk is being worked on.
    let k = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(k.success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let code = child.wait().unwrap().code();
    assert_eq!(code, Some(130), "exit code after Ctrl-C; stderr {stderr:?}");
    assert!(stderr.contains("stopped by signal 2"), "{stderr:?}");
    let printed: BTreeSet<String> = json_lines(&format!("{first}{rest}"))
        .iter()
        .map(|j| Path::new(j["path"].as_str().unwrap()).file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    let written = files(&out);
    println!("Ctrl-C after the first picture: {} of 6 written", written.len());
    assert_eq!(written, printed, "the files are the pictures reported finished, no partial file");
    assert!(written.len() < 6, "the run did not stop: {written:?}");
    for f in &written {
        moss::png::decode(&std::fs::read(out.join(f)).unwrap()).unwrap_or_else(|e| panic!("{f}: {e}"));
    }

    // Resuming renders the rest, each once.
    let r = ok(&[&args[..], &["--skip-existing"]].concat());
    assert_eq!(json_lines(&r.stdout).len(), 6 - written.len(), "{}", r.stdout);
    let all = set(&["00000-42.png", "00001-43.png", "00002-44.png", "00003-45.png", "00004-46.png", "00005-47.png"]);
    assert_eq!(files(&out), all);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flags_are_checked_before_any_work() {
    let dir = scratch("flags");
    let m = model("tiny-a");
    let list = write(&dir, "l.txt", b"a cat\n");
    let out = dir.join("out");
    let base = ["generate", "--device", "cpu", "--prompts", &list, "--out-dir", &s(&out)];
    let refuse = |extra: &[&str], code: i32, needle: &str| {
        let extra = merged(&[&["--model", &m][..], extra].concat());
        let r = moss(&[&base[..], &extra].concat());
        assert_eq!(r.code, code, "{extra:?}: {}", r.stderr);
        if code == 2 {
            // A usage error: clap's whole message (the problem, the usage line, --help).
            assert!(r.stderr.lines().next().unwrap_or("").contains(needle) && r.stderr.contains("--help"), "{extra:?}: {:?}", r.stderr);
        } else {
            assert_eq!(r.stderr.lines().count(), 1, "{extra:?}: {:?}", r.stderr);
            assert!(r.stderr.contains(needle), "{extra:?}: {:?} lacks {needle:?}", r.stderr);
        }
        assert!(r.stdout.is_empty());
        assert!(!out.exists() || files(&out).is_empty(), "{extra:?} wrote something");
    };
    refuse(&["--prompt", "x"], 2, "cannot be used with");
    refuse(&["--out", "x.png"], 2, "cannot be used with");
    refuse(&["--embeds", "e.safetensors"], 2, "cannot be used with");
    refuse(&["--chunk", "0"], 2, "1 or more");
    refuse(&["--steps", "0"], 1, "--steps");
    refuse(&["--guidance", "nan"], 1, "finite");
    refuse(&["--model", "/nonexistent-moss-model"], 1, "nonexistent-moss-model");
    let r = moss(&["generate", "--device", "cpu", "--model", &m, "--prompts", "/nonexistent-moss-list.txt"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("cannot read the prompts list /nonexistent-moss-list.txt"), "{:?}", r.stderr);
    // Batch flags without --prompts.
    for f in [&["--out-dir", "x"][..], &["--skip-existing"], &["--shard", "0/2"], &["--name", "a.png"], &["--chunk", "2"]] {
        let r = moss(&[&["generate", "--device", "cpu", "--model", &m, "--prompt", "a cat"][..], f].concat());
        assert_eq!(r.code, 1, "{f:?}");
        assert!(r.stderr.contains("applies to batch mode only"), "{f:?}: {:?}", r.stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
