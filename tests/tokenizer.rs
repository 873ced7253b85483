//! The prompt path: chat wrapping and tokenizer ids equal to what Python's `tokenizers` gave the
//! golden script for the same tokenizer.json (empty, unicode, combining marks, long, plain).

mod common;

use moss::prompt::{chat_wrap, PromptTokenizer};

#[test]
fn ids_equal_the_python_tokenizer() {
    for name in common::CHECKPOINTS {
        let ck = common::checkpoint(name);
        let tok = PromptTokenizer::from_file(&ck.tokenizer_path()).unwrap();
        let exp = common::Expected::load(name);
        let prompts = exp.json["prompts"].as_array().unwrap();
        assert!(prompts.len() >= 4);
        for p in prompts {
            let text = p["text"].as_str().unwrap();
            let want: Vec<u32> = p["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(chat_wrap(text), p["wrapped"].as_str().unwrap(), "{name}/{}: wrapping", p["name"]);
            let got = tok.encode(text, 4096).unwrap();
            assert_eq!(got.ids, want, "{name}/{}: ids", p["name"]);
            assert_eq!(got.truncated_from, None);
        }
    }
}

#[test]
fn chat_tokens_are_single_ids_and_truncation_keeps_the_head() {
    let ck = common::checkpoint("tiny-a");
    let tok = PromptTokenizer::from_file(&ck.tokenizer_path()).unwrap();
    let ids = tok.encode("", 4096).unwrap().ids;
    let start = tok.token_id("<|im_start|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    let think = tok.token_id("<think>").unwrap();
    assert_eq!(ids[0], start);
    assert!(ids.contains(&end));
    assert_eq!(ids[ids.len() - 2], think, "{ids:?}");
    let long = tok.encode(&"word ".repeat(100), 4096).unwrap();
    let cut = tok.encode(&"word ".repeat(100), 7).unwrap();
    assert_eq!(cut.ids, long.ids[..7].to_vec());
    assert_eq!(cut.truncated_from, Some(long.ids.len()));
    assert!(tok.encode("x", 0).is_err() && tok.encode("x", 4097).is_err());
}

#[test]
fn prompt_files_must_be_utf8() {
    let p = std::env::temp_dir().join(format!("moss-bad-utf8-{}", std::process::id()));
    std::fs::write(&p, b"caf\xe9\n").unwrap();
    let e = moss::prompt::read_prompt_file(&p).unwrap_err().to_string();
    assert!(e.contains("not valid UTF-8") && e.contains("offset 3"), "{e}");
    std::fs::write(&p, "café\n").unwrap();
    assert_eq!(moss::prompt::read_prompt_file(&p).unwrap(), "café\n");
    let _ = std::fs::remove_file(&p);
}
