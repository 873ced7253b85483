//! Checkpoint discovery and validation: the golden checkpoints are accepted; planted breakages
//! (a deleted tensor, a wrong shape, a wrong dtype, a truncated shard, a wrong `_class_name`,
//! a missing component) are rejected with a message that names the problem and its file.

mod common;

use moss::checkpoint::{self, Checkpoint, TensorStore};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// A scratch copy of a golden checkpoint, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn of(name: &str, tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("moss-ck-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&common::golden().join(name), &dir);
        Scratch(dir)
    }
    fn open(&self) -> anyhow::Result<Checkpoint> {
        Checkpoint::open(checkpoint::locate(self.0.to_str().unwrap())?)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Rewrite one safetensors file with `edit` applied to its (name → (dtype, shape, bytes)) map.
fn rewrite(file: &Path, edit: impl FnOnce(&mut HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut map: HashMap<_, _> = st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    edit(&mut map);
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        map.iter().map(|(n, (d, s, b))| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(file, safetensors::tensor::serialize(views, None).unwrap()).unwrap();
}

fn err_of(r: anyhow::Result<impl Sized>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

/// The shard holding `name` in a component folder.
fn shard_of(dir: &Path, name: &str) -> PathBuf {
    let store = TensorStore::open(dir).unwrap();
    let info = store.get(name).unwrap_or_else(|| panic!("{name} not in {}", dir.display()));
    store.file_of(info).to_path_buf()
}

#[test]
fn golden_checkpoints_are_complete() {
    for name in common::CHECKPOINTS {
        let ck = common::checkpoint(name);
        for comp in ["text_encoder", "transformer", "vae"] {
            let c = ck.open_component(comp).unwrap_or_else(|e| panic!("{name}/{comp}: {e:#}"));
            let (params, bytes, _) = c.summary();
            assert!(params > 0 && bytes >= 2 * params, "{name}/{comp}: {params} params, {bytes} bytes");
        }
        assert!(moss::check::checkpoint_rows(&ck).iter().all(|r| r.verdict.is_ok()), "{name}: check rows");
    }
}

#[test]
fn configs_read_as_the_golden_script_wrote_them() {
    let a = common::checkpoint("tiny-a");
    assert_eq!(a.dit.num_layers, 23);
    assert_eq!((a.dit.dim, a.dit.num_heads, a.dit.head_dim()), (128, 1, 128));
    assert_eq!(a.encoder.num_layers(), 8);
    let full: Vec<usize> = (0..8).filter(|&i| a.encoder.layer_types[i] == checkpoint::config::LayerType::Full).collect();
    assert_eq!(full, vec![3, 7]);
    assert_eq!(a.scheduler, moss::schedule::ScheduleConfig::default());
    let b = common::checkpoint("tiny-b");
    assert_eq!((b.dit.num_layers, b.dit.num_heads), (2, 2));
    assert_eq!(b.vae.decoder_block_out_channels, vec![32, 64, 64, 96]);
}

#[test]
fn a_deleted_tensor_is_named_with_its_folder() {
    let s = Scratch::of("tiny-a", "del");
    let dir = s.0.join("transformer");
    let name = "layers.22.proj.ffn_down.weight";
    rewrite(&shard_of(&dir, name), |m| {
        m.remove(name);
    });
    // Also drop it from the index, so only the validation can notice.
    let idx = dir.join("diffusion_pytorch_model.safetensors.index.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&idx).unwrap()).unwrap();
    v["weight_map"].as_object_mut().unwrap().remove(name);
    std::fs::write(&idx, v.to_string()).unwrap();
    let e = err_of(s.open().unwrap().open_component("transformer"));
    assert!(e.contains(name) && e.contains("missing") && e.contains("transformer"), "{e}");
}

#[test]
fn a_tensor_the_index_lists_but_its_shard_lacks_is_reported() {
    let s = Scratch::of("tiny-a", "idx");
    let dir = s.0.join("text_encoder");
    let name = "language_model.layers.0.linear_attn.A_log";
    let shard = shard_of(&dir, name);
    rewrite(&shard, |m| {
        m.remove(name);
    });
    let e = err_of(s.open().unwrap().open_component("text_encoder"));
    assert!(e.contains(name) && e.contains(shard.file_name().unwrap().to_str().unwrap()), "{e}");
}

#[test]
fn a_wrong_shape_is_named_with_its_file() {
    let s = Scratch::of("tiny-b", "shape");
    let dir = s.0.join("transformer");
    let name = "layers.1.proj.q.weight";
    let shard = shard_of(&dir, name);
    rewrite(&shard, |m| {
        let t = m.get_mut(name).unwrap();
        t.1 = vec![t.1[0] / 2, t.1[1] * 2];
    });
    let e = err_of(s.open().unwrap().open_component("transformer"));
    assert!(e.contains(name) && e.contains("shape") && e.contains(shard.to_str().unwrap()), "{e}");
}

#[test]
fn a_wrong_dtype_is_named() {
    let s = Scratch::of("tiny-b", "dtype");
    let dir = s.0.join("vae");
    let name = "bn.running_var";
    let shard = shard_of(&dir, name);
    rewrite(&shard, |m| {
        let t = m.get_mut(name).unwrap();
        let f: Vec<u8> = t.2.chunks_exact(4).flat_map(|c| half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()).collect();
        *t = (safetensors::Dtype::F16, t.1.clone(), f);
    });
    let e = err_of(s.open().unwrap().open_component("vae"));
    assert!(e.contains(name) && e.contains("f16") && e.contains("f32"), "{e}");
}

#[test]
fn a_truncated_shard_is_refused() {
    let s = Scratch::of("tiny-a", "trunc");
    let f = s.0.join("transformer/diffusion_pytorch_model-00002-of-00003.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len - 1000).unwrap();
    let e = err_of(s.open().unwrap().open_component("transformer"));
    assert!(e.contains("00002-of-00003") && e.contains("not a complete safetensors file"), "{e}");
}

#[test]
fn a_wrong_class_name_is_refused() {
    let s = Scratch::of("tiny-b", "class");
    let p = s.0.join("model_index.json");
    let text = std::fs::read_to_string(&p).unwrap().replace("MOSSImagePipeline", "FluxPipeline");
    std::fs::write(&p, text).unwrap();
    let e = err_of(s.open());
    assert!(e.contains("FluxPipeline") && e.contains("MOSSImagePipeline") && e.contains("model_index.json"), "{e}");
}

#[test]
fn a_missing_component_folder_is_refused() {
    let s = Scratch::of("tiny-b", "comp");
    std::fs::remove_dir_all(s.0.join("vae")).unwrap();
    let e = err_of(s.open());
    assert!(e.contains("vae"), "{e}");
}

#[test]
fn repo_ids_resolve_in_the_hub_cache_and_missing_models_say_where_they_looked() {
    let hub = std::env::temp_dir().join(format!("moss-hub-{}", std::process::id()));
    let snap = hub.join("models--Org--Tiny/snapshots/abc123");
    copy_dir(&common::golden().join("tiny-b"), &snap);
    std::fs::create_dir_all(hub.join("models--Org--Tiny/refs")).unwrap();
    std::fs::write(hub.join("models--Org--Tiny/refs/main"), "abc123").unwrap();
    // SAFETY: this test is the only one that reads HF_HUB_CACHE.
    unsafe { std::env::set_var("HF_HUB_CACHE", &hub) };
    let loc = checkpoint::locate("Org/Tiny").unwrap();
    assert_eq!(loc.root, snap);
    assert_eq!(loc.revision.as_deref(), Some("abc123"));
    Checkpoint::open(loc).unwrap();
    let e = err_of(checkpoint::locate("Org/Missing"));
    assert!(e.contains("models--Org--Missing") && e.contains("hf download"), "{e}");
    let _ = std::fs::remove_dir_all(&hub);
}
