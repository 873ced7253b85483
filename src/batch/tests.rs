//! The list, names, shards, plans and chunks on the host.

use super::*;
use crate::backend::Device;
use std::ops::Range;
use std::path::Path;

fn d() -> PictureSpec {
    PictureSpec { negative: "blurry".into(), seed: 100, steps: 4, guidance: 3.0, width: 64, height: 64, ..Default::default() }
}

fn vars(index: usize, seed: u64, prompt: &str) -> NameVars<'_> {
    NameVars { index, line: index + 2, seed, shard: index % 3, prompt }
}

#[test]
fn plain_json_and_blank_lines() {
    let text = b"\xef\xbb\xbfa cat  \r\n\n   \n{\"prompt\": \"a dog\", \"seed\": 7, \"size\": \"96x64\", \"steps\": 2, \"guidance\": 1, \"negative\": \"\", \"out\": \"x/{index}.png\"}\n{\"prompt\":\"p\",\"seed\":null}\n  {not json\n";
    let v = parse_list(text, &d());
    assert_eq!(v.len(), 4);
    let a = v[0].as_ref().unwrap();
    assert_eq!((a.index, a.line, a.spec.prompt.as_str(), a.spec.seed, a.spec.negative.as_str()), (0, 1, "a cat", 100, "blurry"));
    let b = v[1].as_ref().unwrap();
    assert_eq!((b.index, b.line, b.spec.prompt.as_str(), b.spec.seed), (1, 4, "a dog", 7));
    assert_eq!((b.spec.width, b.spec.height, b.spec.steps, b.spec.guidance, b.spec.negative.as_str()), (96, 64, 2, 1.0, ""));
    assert_eq!(b.out.as_deref(), Some("x/{index}.png"));
    let c = v[2].as_ref().unwrap();
    assert_eq!((c.index, c.spec.seed, c.spec.steps), (2, 102, 4), "null leaves the default");
    let e = v[3].as_ref().unwrap_err();
    assert_eq!((e.index, e.line), (3, 6));
    assert!(e.error.contains("invalid JSON"), "{}", e.error);
}

#[test]
fn bad_fields() {
    let bad = |line: &str, needle: &str| {
        let e = parse_line(line, 0, 1, &d()).unwrap_err();
        assert!(e.contains(needle), "{line}: {e:?} lacks {needle:?}");
    };
    bad(r#"{"prompt": "x", "size": "100x64"}"#, "multiple of 16");
    bad(r#"{"prompt": "x", "size": "8192x64"}"#, "cap");
    bad(r#"{"prompt": "x", "size": 64}"#, "`size` must be a string");
    bad(r#"{"prompt": "x", "steps": 0}"#, "steps 0");
    bad(r#"{"prompt": "x", "steps": 1001}"#, "steps 1001");
    bad(r#"{"prompt": "x", "steps": 2.5}"#, "whole number");
    bad(r#"{"prompt": "x", "seed": -1}"#, "seed");
    bad(r#"{"prompt": "x", "guidance": "3"}"#, "number");
    bad(r#"{"prompt": "x", "guidance": 1e300}"#, "finite");
    bad(r#"{"prompt": "x", "sede": 1}"#, "unknown field `sede`");
    bad(r#"{"prompt": "x", "out": "{nope}.png"}"#, "unknown field `{nope}`");
    bad(r#"{"prompt": "x", "out": ""}"#, "empty");
    bad(r#"{"seed": 1}"#, "no `prompt`");
    bad(r#"{"prompt": 5}"#, "must be a string");
    bad(r#"{"prompt": "x"} trailing"#, "invalid JSON");
    let e = &parse_list(b"ok\n\xff\xfe bad\nok\n", &d())[1];
    assert_eq!(e.as_ref().unwrap_err().line, 2);
    assert!(e.as_ref().unwrap_err().error.contains("UTF-8"));
    assert!(check_defaults(&PictureSpec { steps: 0, ..d() }).unwrap_err().to_string().contains("--steps"));
}

#[test]
fn templates() {
    let t = |s: &str, v: &NameVars| Template::parse(s).unwrap().render(v);
    assert_eq!(t(DEFAULT_NAME, &vars(7, 42, "")), "00007-42.png");
    assert_eq!(t("{index}-{line:03}-{seed:06}-{shard}.png", &vars(12, 5, "")), "12-014-000005-0.png");
    assert_eq!(t("{{x}}/{stem}.png", &vars(0, 0, "A Cat, on a MAT!  (oil)")), "{x}/a-cat-on-a-mat-oil.png");
    assert_eq!(t("{stem:5}", &vars(0, 0, "Hello world")), "hello");
    assert_eq!(t("{stem:6}", &vars(0, 0, "Hello world")), "hello", "no dash at the end");
    assert_eq!(t("{stem}", &vars(0, 0, "  !!! ")), "prompt");
    assert_eq!(t("{stem}", &vars(0, 0, "東京の猫")), "東京の猫");
    assert_eq!(t("{index:05}", &vars(123456, 0, "")), "123456", "wider numbers are kept whole");
    for (bad, needle) in [
        ("{foo}.png", "unknown field"),
        ("{index.png", "not closed"),
        ("a}.png", "lone"),
        ("{index:5}", ":0N"),
        ("{index:0x}", "width"),
        ("{stem:0}", "width"),
        ("", "empty"),
    ] {
        let e = Template::parse(bad).unwrap_err();
        assert!(e.contains(needle), "{bad}: {e}");
    }
}

#[test]
fn shards() {
    assert_eq!("1/4".parse::<Shard>(), Ok(Shard { k: 1, n: 4 }));
    assert_eq!("0/1".parse::<Shard>(), Ok(Shard::default()));
    assert!("4/4".parse::<Shard>().unwrap_err().contains("counts from 0"));
    assert!("0/0".parse::<Shard>().unwrap_err().contains("at least 1"));
    assert!("1".parse::<Shard>().unwrap_err().contains("K/N"));
    assert!("-1/4".parse::<Shard>().is_err());
    let n = 3;
    let mut seen = vec![0; 10];
    for k in 0..n {
        let s = Shard { k, n };
        for (i, c) in seen.iter_mut().enumerate() {
            if s.owns(i) {
                *c += 1;
            }
        }
    }
    assert_eq!(seen, vec![1; 10]);
}

#[test]
fn plans_name_shard_and_refuse_clashes() {
    let text = b"a\nb\n{\"prompt\":\"c\",\"out\":\"00000-100.png\"}\n{\"prompt\":\"d\",\"out\":\"./x.png\"}\n{\"prompt\":\"e\",\"out\":\"x.png\"}\n{bad\n";
    let dir = Path::new("/tmp/moss-plan-unit");
    let name = Template::parse(DEFAULT_NAME).unwrap();
    let p = plan(parse_list(text, &d()), dir, &name, Shard::default(), false, false);
    let names: Vec<String> = p.jobs.iter().map(|j| j.path.display().to_string()).collect();
    assert_eq!(names, ["/tmp/moss-plan-unit/00000-100.png", "/tmp/moss-plan-unit/00001-101.png", "/tmp/moss-plan-unit/x.png"]);
    let bad: Vec<(usize, bool)> = p.bad.iter().map(|b| (b.line, b.error.contains("already line"))).collect();
    assert_eq!(bad, [(3, true), (5, true), (6, false)], "{:?}", p.bad);
    // Shard 1/2 owns indices 1, 3, 5: item 3 (d) renders, 5 (bad) fails, 1 renders.
    let p = plan(parse_list(text, &d()), dir, &name, Shard { k: 1, n: 2 }, false, false);
    assert_eq!(p.jobs.iter().map(|j| j.item.index).collect::<Vec<_>>(), [1, 3]);
    assert_eq!(p.bad.iter().map(|b| b.index).collect::<Vec<_>>(), [5]);
    assert_eq!(p.elsewhere, 3);
}

#[test]
fn plans_keep_items_inside_the_out_dir() {
    let dir = std::env::temp_dir().join(format!("moss-plan-escape-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("x")).unwrap();
    let abs = dir.join("same.png");
    let text = format!(
        "{{\"prompt\":\"a\",\"out\":\"same.png\"}}\n{{\"prompt\":\"b\",\"out\":\"x/../same.png\"}}\n\
         {{\"prompt\":\"c\",\"out\":\"{}\"}}\n{{\"prompt\":\"d\",\"out\":\"../keep.png\"}}\n\
         {{\"prompt\":\"e\",\"out\":\"x/../../keep.png\"}}\n{{\"prompt\":\"f\",\"out\":\"x/ok.png\"}}\n",
        abs.display()
    );
    let name = Template::parse(DEFAULT_NAME).unwrap();
    let p = plan(parse_list(text.as_bytes(), &d()), &dir, &name, Shard::default(), false, false);
    assert_eq!(p.jobs.iter().map(|j| j.item.line).collect::<Vec<_>>(), [1, 6]);
    let why: Vec<(usize, &str)> = p.bad.iter().map(|b| (b.line, b.error.as_str())).collect();
    assert!(why[0].0 == 2 && why[0].1.contains("already line 1"), "{why:?}");
    assert!(why[1].0 == 3 && why[1].1.contains("absolute"), "{why:?}");
    assert!(why[2].0 == 4 && why[2].1.contains("leaves --out-dir"), "{why:?}");
    assert!(why[3].0 == 5 && why[3].1.contains("leaves --out-dir"), "{why:?}");
    // With the opt-in, the absolute spelling of line 1's file is a clash, not a second file.
    let p = plan(parse_list(text.as_bytes(), &d()), &dir, &name, Shard::default(), false, true);
    assert!(p.bad.iter().any(|b| b.line == 3 && b.error.contains("already line 1")), "{:?}", p.bad);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn chunks() {
    assert_eq!(plan_chunks(&[1, 1, 1, 1, 1], u64::MAX, None), vec![0..5]);
    assert_eq!(plan_chunks(&[1, 1, 1, 1, 1], u64::MAX, Some(2)), vec![0..2, 2..4, 4..5]);
    assert_eq!(plan_chunks(&[5, 5, 5, 20, 1], 10, None), vec![0..2, 2..3, 3..4, 4..5]);
    assert_eq!(plan_chunks(&[], 10, None), Vec::<Range<usize>>::new());
    assert_eq!(chunk_budget_bytes(Device::Cpu), u64::MAX, "on the cpu a chunk is the whole list");
    assert_eq!(job_bytes(10, 64, 128, 64, 32), 4 * (640 + 128 * 8));
}
