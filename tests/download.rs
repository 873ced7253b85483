//! Host emulation of the pinned download schedule (
//! `moss::backend::cuda::ops::pipelined`): the asynchronous copies into the slots are applied
//! either at once when issued (the earliest a DMA could land) or only when their chunk is taken
//! (the latest), and the result must be the source bit for bit in both cases, for sizes with a
//! ragged tail, exactly one chunk, under one chunk, and more chunks than slots. The planted bug
//! of `moss check` (`drop_tail`: the schedule run over the bytes before the last chunk, what
//! `Cuda::download_pinned` does when asked for fewer bytes) must leave the tail unwritten, and a schedule that re-issued a slot before its
//! chunk was taken would fail the "earliest" emulation (checked with a deliberately broken one).

use moss::backend::cuda::ops::{convert_into, pipelined, DType};
use std::cell::RefCell;
use std::collections::VecDeque;

/// Emulate the download of `src` (bf16 bytes) into f32 values. `early`: copies land when issued;
/// else they land when their chunk is taken. `reissue_early` plants a schedule bug instead of
/// `pipelined`: every chunk issued up front, slots reused before their chunk was consumed.
fn emulate(src: &[u8], chunk: usize, slots: usize, drop_tail: bool, early: bool, reissue_early: bool) -> Vec<f32> {
    struct State {
        slot_mem: Vec<Vec<u8>>,
        pending: VecDeque<(usize, usize, usize)>, // (slot, off, len) in stream order
        holds: Vec<Option<usize>>,                // chunk last issued into each slot
    }
    let st = RefCell::new(State { slot_mem: vec![vec![0u8; chunk]; slots], pending: VecDeque::new(), holds: vec![None; slots] });
    let mut out = vec![0f32; src.len() / 2];
    let land = |st: &mut State, k: usize, off: usize, len: usize| st.slot_mem[k][..len].copy_from_slice(&src[off..off + len]);
    let mut issue = |i: usize, k: usize, off: usize, len: usize| -> anyhow::Result<()> {
        assert!(off.is_multiple_of(chunk) && len <= chunk && off + len <= src.len(), "chunk {i}: off {off} len {len}");
        let st = &mut *st.borrow_mut();
        if !reissue_early {
            assert_eq!(st.holds[k], None, "slot {k} re-issued (chunk {i}) before its chunk was taken");
        }
        st.holds[k] = Some(i);
        if early {
            land(st, k, off, len);
        } else {
            st.pending.push_back((k, off, len));
        }
        Ok(())
    };
    let mut take = |i: usize, k: usize, off: usize, len: usize| -> anyhow::Result<()> {
        let st = &mut *st.borrow_mut();
        // Waiting on slot k's event completes every copy issued up to that one (stream order).
        while let Some((pk, poff, plen)) = st.pending.pop_front() {
            land(st, pk, poff, plen);
            if pk == k && poff == off {
                break;
            }
        }
        if !reissue_early {
            assert_eq!(st.holds[k], Some(i), "chunk {i} taken from slot {k}, which holds {:?}", st.holds[k]);
        }
        st.holds[k] = None;
        convert_into(&mut out[off / 2..][..len / 2], &st.slot_mem[k][..len], DType::BF16);
        Ok(())
    };
    if reissue_early {
        let chunks = src.len().div_ceil(chunk);
        let span = |i: usize| (i * chunk, chunk.min(src.len() - i * chunk));
        for i in 0..chunks {
            let (off, len) = span(i);
            issue(i, i % slots, off, len).unwrap();
        }
        for i in 0..chunks {
            let (off, len) = span(i);
            take(i, i % slots, off, len).unwrap();
        }
    } else {
        // The planted bug: the same schedule over the bytes before the last chunk.
        let copied = if drop_tail { (src.len() - 1) / chunk * chunk } else { src.len() };
        pipelined(copied, chunk, slots, &mut issue, &mut take).unwrap();
    }
    assert!(st.borrow().pending.is_empty(), "copies left in flight");
    out
}

fn source(n: usize) -> (Vec<u8>, Vec<f32>) {
    // Deterministic bf16 values, all distinct in the low bits, none zero.
    let vals: Vec<half::bf16> = (0..n).map(|i| half::bf16::from_f32(1.0 + (i % 997) as f32 / 64.0 + (i / 997) as f32)).collect();
    let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    (bytes, vals.iter().map(|v| v.to_f32()).collect())
}

#[test]
fn pipelined_download_is_exact_for_any_copy_timing() {
    let chunk = 4096; // bytes
    for slots in [1, 2, 4] {
        for n in [1usize, 77, chunk / 2, chunk, chunk / 2 * 7 / 2 + 77, chunk / 2 * 13 + 1] {
            let (src, want) = source(n);
            for early in [true, false] {
                let got = emulate(&src, chunk, slots, false, early, false);
                assert!(got == want, "n {n}, slots {slots}, early {early}: values differ");
            }
        }
    }
}

#[test]
fn pipelined_download_controls_are_caught() {
    let chunk = 4096;
    let n = chunk / 2 * 7 / 2 + 77; // 4 chunks, the last ragged
    let (src, want) = source(n);
    // The planted bug of the device gate: the last chunk never copied.
    for early in [true, false] {
        let got = emulate(&src, chunk, 4, true, early, false);
        let tail = (2 * n - 1) / chunk * chunk / 2; // first value of the last chunk
        assert_eq!(tail, 3 * chunk / 2);
        assert!(got[..tail] == want[..tail], "drop_tail changed the copied chunks");
        assert!(got[tail..].iter().all(|&v| v == 0.0), "drop_tail: the tail was written");
        assert!(got != want, "drop_tail not visible");
    }
    // A schedule that reuses a slot before its chunk was consumed gives wrong values when the
    // copies land early: the emulation can see that class of bug.
    let got = emulate(&src, chunk, 2, false, true, true);
    assert!(got != want, "slot reuse before consumption was not detected by the emulation");
}

#[test]
fn pipelined_rejects_empty_geometry() {
    assert!(pipelined(10, 0, 2, |_, _, _, _| Ok(()), |_, _, _, _| Ok(())).is_err());
    let mut n = 0;
    pipelined(
        0,
        8,
        2,
        |_, _, _, _| Ok(()),
        |_, _, _, _| {
            n += 1;
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(n, 0);
}
