//! The layers are crates, so the compiler keeps their edges one way: `moss-core` cannot name
//! `moss-cuda` or the front end, `moss-cuda` cannot name the front end (a cycle cargo refuses).
//! What the compiler would still allow is a new downward-looking dependency in a lower manifest
//! (the core taking the GPU or the command line); this test reads the manifests through
//! `cargo metadata` and refuses that.

use std::collections::BTreeMap;

/// Each workspace package's normal (non-dev) dependencies, by name.
fn workspace_deps() -> BTreeMap<String, Vec<String>> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"].as_array().unwrap().iter().filter(|d| d["kind"].is_null()).map(|d| d["name"].as_str().unwrap().to_string()).collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// Crates that belong to the GPU or the front end (command line, server, pictures on disk).
const GPU: &[&str] = &["moss-cuda", "cudarc"];
const FRONT_END: &[&str] = &["moss", "clap", "clap_complete", "clap_mangen", "axum", "tokio", "hyper", "hyper-util", "tower-http", "indicatif", "image", "png"];

fn violations(deps: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut bad = vec![];
    let mut refuse = |pkg: &str, banned: &[&str]| {
        for d in deps.get(pkg).into_iter().flatten() {
            if banned.contains(&d.as_str()) {
                bad.push(format!("{pkg} depends on {d}"));
            }
        }
    };
    refuse("moss-core", GPU);
    refuse("moss-core", FRONT_END);
    refuse("moss-cuda", FRONT_END);
    bad
}

#[test]
fn lower_crates_know_neither_the_gpu_nor_the_front_end() {
    let deps = workspace_deps();
    for p in ["moss", "moss-core", "moss-cuda"] {
        assert!(deps.contains_key(p), "workspace package {p} missing: {:?}", deps.keys());
    }
    assert!(deps["moss-cuda"].contains(&"moss-core".to_string()), "moss-cuda implements moss-core's op set");
    let bad = violations(&deps);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The check itself sees a planted upward edge.
#[test]
fn a_planted_upward_edge_is_seen() {
    let mut deps = workspace_deps();
    deps.get_mut("moss-core").unwrap().push("moss-cuda".into());
    deps.get_mut("moss-cuda").unwrap().push("axum".into());
    assert_eq!(violations(&deps), ["moss-core depends on moss-cuda", "moss-cuda depends on axum"]);
}
