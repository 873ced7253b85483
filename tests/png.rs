//! PNG output: metadata round trip (Latin-1 and UTF-8 values), RGB8 pixels, atomic writes,
//! rounding half to even.

use moss::output::write as write_atomic;
use moss::png::{decode, encode, to_u8, Metadata};

#[test]
fn metadata_and_pixels_round_trip() {
    let (w, h) = (5u32, 3u32);
    let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 256) as u8).collect();
    let mut m = Metadata::default();
    m.push("prompt", "a café at dusk, 東京 ☕\nsecond line");
    m.push("negative", "");
    m.push("seed", 18446744073709551615u64);
    m.push("guidance", 3.0);
    m.push("size", "16x16");
    let bytes = encode(&rgb, w, h, &m).unwrap();
    let (px, ww, hh, back) = decode(&bytes).unwrap();
    assert_eq!((ww, hh), (w, h));
    assert_eq!(px, rgb);
    for (k, v) in &m.entries {
        assert_eq!(back.get(k), Some(v.as_str()), "{k}");
    }
    // Latin-1 values go into plain tEXt chunks, which every tool reads.
    let text_pos = bytes.windows(4).position(|c| c == b"tEXt").expect("a tEXt chunk");
    assert!(text_pos > 0);
    assert!(bytes.windows(4).any(|c| c == b"iTXt"), "the non-Latin-1 prompt goes in iTXt");
}

#[test]
fn writes_are_atomic_and_leave_no_partial_file() {
    let dir = std::env::temp_dir().join(format!("moss-png-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("pic.png");
    write_atomic(&out, b"first").unwrap();
    write_atomic(&out, b"second").unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), b"second");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(write_atomic(&dir.join("no/such/dir/pic.png"), b"x").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pixel_rounding_is_half_to_even_like_numpy() {
    // value v maps to (v/2 + 0.5)*255; pick v so that the product is exactly k + 0.5.
    let mut exact = 0;
    for (k, want) in [(0u32, 0u8), (1, 2), (2, 2), (127, 128), (253, 254), (254, 254)] {
        let t = (k as f32 + 0.5) / 255.0; // x/2 + 0.5
        let x = (t - 0.5) * 2.0;
        let p = ((x / 2.0 + 0.5).clamp(0.0, 1.0)) * 255.0;
        if p == k as f32 + 0.5 {
            assert_eq!(to_u8(x), want, "k = {k}");
            exact += 1;
        }
    }
    assert!(exact >= 3, "only {exact} exact half cases exercised");
    assert_eq!(to_u8(-1.0), 0);
    assert_eq!(to_u8(1.0), 255);
    assert_eq!(to_u8(-5.0), 0);
    assert_eq!(to_u8(0.0), 128);
}
