//! The host transport's collectives, Ulysses attention against one rank's, the crew's vote; each
//! with a planted control the same check must reject.

use super::host::HostTransport;
use super::{ulysses, Crew, Endpoints, Layout, Transport};
use crate::backend::cpu::Cpu;
use crate::backend::ops::DitOps;
use crate::tensor::Tensor;
use anyhow::{ensure, Result};

/// Run `f(rank, transport)` on a thread per endpoint; every rank's result, in rank order.
fn on_ranks<T: Send, R: Send>(ts: Vec<T>, f: impl Fn(usize, T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = ts.into_iter().enumerate().map(|(r, t)| s.spawn(move || f(r, t))).collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

fn tagged(shape: Vec<usize>, tag: f32) -> Tensor {
    let n = shape.iter().product();
    Tensor { shape, data: (0..n).map(|i| tag * 1000.0 + i as f32).collect() }
}

/// One rank's part of the collectives check: an all-gather and an all-to-all with equal shapes
/// (only the values tell the senders apart) and with shapes that name sender and receiver.
fn collectives(me: usize, t: &dyn Transport<Cpu>) -> Result<()> {
    let n = t.ranks();
    ensure!(t.rank() == me, "rank {} says it is {}", me, t.rank());
    let g = t.all_gather(&Cpu, &tagged(vec![2, 3], me as f32), &vec![vec![2, 3]; n])?;
    for (j, x) in g.iter().enumerate() {
        ensure!(*x == tagged(vec![2, 3], j as f32), "all_gather: entry {j} on rank {me} is not rank {j}'s");
    }
    let shapes: Vec<Vec<usize>> = (0..n).map(|j| vec![j + 1, 2]).collect();
    let g = t.all_gather(&Cpu, &tagged(shapes[me].clone(), me as f32), &shapes)?;
    for (j, x) in g.iter().enumerate() {
        ensure!(*x == tagged(shapes[j].clone(), j as f32), "all_gather (ragged): entry {j} on rank {me} is not rank {j}'s");
    }
    let tag = |from: usize, to: usize| (from * 10 + to) as f32;
    let got = t.all_to_all(&Cpu, (0..n).map(|j| tagged(vec![2, 2], tag(me, j))).collect(), &vec![vec![2, 2]; n])?;
    for (j, x) in got.iter().enumerate() {
        ensure!(*x == tagged(vec![2, 2], tag(j, me)), "all_to_all: entry {j} on rank {me} is not what rank {j} sent it");
    }
    let parts = (0..n).map(|j| tagged(vec![me + 1, j + 1], tag(me, j))).collect();
    let got = t.all_to_all(&Cpu, parts, &(0..n).map(|j| vec![j + 1, me + 1]).collect::<Vec<_>>())?;
    for (j, x) in got.iter().enumerate() {
        ensure!(*x == tagged(vec![j + 1, me + 1], tag(j, me)), "all_to_all (ragged): entry {j} on rank {me} is not what rank {j} sent it");
    }
    Ok(())
}

fn check_group(ts: Vec<Box<dyn Transport<Cpu>>>) -> Result<()> {
    on_ranks(ts, |r, t| {
        let res = collectives(r, t.as_ref());
        if res.is_err() {
            t.abort(); // the others must not wait for this rank
        }
        res
    })
    .into_iter()
    .collect()
}

fn host(n: usize) -> Vec<Box<dyn Transport<Cpu>>> {
    HostTransport::group(n).into_iter().map(|t| Box::new(t) as Box<dyn Transport<Cpu>>).collect()
}

/// The planted control: a transport that hands its results back in the wrong order (rotated by
/// one), as a mix-up of peers would.
struct Rotated(HostTransport);

impl Transport<Cpu> for Rotated {
    fn rank(&self) -> usize {
        Transport::<Cpu>::rank(&self.0)
    }
    fn ranks(&self) -> usize {
        Transport::<Cpu>::ranks(&self.0)
    }
    fn all_gather(&self, b: &Cpu, x: &Tensor, shapes: &[Vec<usize>]) -> Result<Vec<Tensor>> {
        let mut v = self.0.all_gather(b, x, shapes)?;
        v.rotate_left(1);
        Ok(v)
    }
    fn all_to_all(&self, b: &Cpu, parts: Vec<Tensor>, shapes: &[Vec<usize>]) -> Result<Vec<Tensor>> {
        let mut v = self.0.all_to_all(b, parts, shapes)?;
        v.rotate_left(1);
        Ok(v)
    }
    fn abort(&self) {
        Transport::<Cpu>::abort(&self.0)
    }
}

#[test]
fn host_collectives_deliver_each_rank_its_peers_parts_in_rank_order() {
    for n in [2, 3, 4, 8] {
        check_group(host(n)).unwrap_or_else(|e| panic!("{n} ranks: {e:#}"));
    }
}

#[test]
fn the_check_rejects_a_transport_that_mixes_up_the_order() {
    for n in [2, 3, 4] {
        let ts = HostTransport::group(n).into_iter().map(|t| Box::new(Rotated(t)) as Box<dyn Transport<Cpu>>).collect();
        let e = check_group(ts).expect_err("the rotated transport must be caught");
        let msg = format!("{e:#}");
        assert!(msg.contains("all_gather") || msg.contains("another rank failed"), "{n} ranks: {msg}");
    }
}

#[test]
fn a_shape_the_receiver_does_not_expect_is_an_error_and_abort_frees_the_waiters() {
    let mut ts = HostTransport::group(2);
    let (t1, t0) = (ts.pop().unwrap(), ts.pop().unwrap());
    let r = on_ranks(vec![(0, t0), (1, t1)], |_, (me, t)| {
        // Rank 1 sends [2, 2]; rank 0 expects [1, 2] from it.
        let x = Tensor::zeros(&[me + 1, 2]);
        Transport::<Cpu>::all_gather(&t, &Cpu, &x, &[vec![1, 2], vec![me + 1, 2]]).map(|_| ())
    });
    assert!(r[0].as_ref().is_err_and(|e| e.to_string().contains("sent [2, 2]")), "{:?}", r[0].as_ref().err());
    // Rank 1 fails before its collective and aborts: rank 0 is not left waiting.
    let mut ts = HostTransport::group(2);
    let (t1, t0) = (ts.pop().unwrap(), ts.pop().unwrap());
    let r = on_ranks(vec![(0, t0), (1, t1)], |_, (me, t)| {
        if me == 1 {
            Transport::<Cpu>::abort(&t);
            std::thread::sleep(std::time::Duration::from_millis(100));
            return Err(anyhow::anyhow!("rank 1's own error"));
        }
        Transport::<Cpu>::all_gather(&t, &Cpu, &Tensor::zeros(&[1]), &[vec![1], vec![1]]).map(|_| ())
    });
    assert!(r[0].as_ref().is_err_and(|e| e.to_string().contains("another rank failed")));
}

fn pseudo(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Ulysses attention on `p` ranks over rows of `qkv`, the ranks' outputs in row order.
fn ulysses_on(p: usize, qkv: &Tensor, heads: usize, mix: bool) -> Result<Tensor> {
    let n = qkv.shape[0];
    let ts: Vec<Box<dyn Transport<Cpu>>> = match mix {
        false => host(p),
        true => HostTransport::group(p).into_iter().map(|t| Box::new(Rotated(t)) as Box<dyn Transport<Cpu>>).collect(),
    };
    let outs = on_ranks(ts, |r, t| {
        let rows = ulysses::rows(n, p, r);
        let mine = Cpu.narrow(qkv, 0, rows.start, rows.len())?;
        ulysses::attention(&Cpu, t.as_ref(), &mine, heads, n, 0.3)
    });
    let outs = outs.into_iter().collect::<Result<Vec<_>>>()?;
    Cpu.cat(&outs.iter().collect::<Vec<_>>(), 0)
}

use crate::backend::Backend;

#[test]
fn ulysses_attention_is_one_ranks_attention_bit_for_bit_and_a_mixed_up_order_is_not() {
    let (heads, hd) = (4, 8);
    for n in [37, 40] {
        let qkv = Tensor::new(vec![n, 3 * heads * hd], pseudo(n * 3 * heads * hd, n as u32)).unwrap();
        let one = Cpu.attention_packed(&qkv, heads, 0.3).unwrap();
        for p in [2, 4] {
            let many = ulysses_on(p, &qkv, heads, false).unwrap();
            assert_eq!(many.shape, one.shape);
            assert!(many.data == one.data, "{n} tokens on {p} ranks: rel L2 {}", crate::tensor::rel_l2(&many.data, &one.data));
            let mixed = ulysses_on(p, &qkv, heads, true).unwrap();
            let d = crate::tensor::rel_l2(&mixed.data, &one.data);
            assert!(d > 1e-2, "the control (peers' parts in the wrong order) must be far from one rank: {d}");
        }
    }
}

#[test]
fn rows_split_evenly_and_cover_the_sequence() {
    for (n, p) in [(10, 3), (17, 4), (8, 8), (4104, 8)] {
        let rs: Vec<_> = (0..p).map(|r| ulysses::rows(n, p, r)).collect();
        assert_eq!(rs[0].start, 0);
        assert_eq!(rs[p - 1].end, n);
        assert!(rs.windows(2).all(|w| w[0].end == w[1].start && w[0].len() >= w[1].len() && w[0].len() <= w[1].len() + 1), "{rs:?}");
    }
}

#[test]
fn gathered_rows_are_every_ranks_rows_in_order() {
    let n = 11;
    let x = Tensor::new(vec![n, 3], pseudo(n * 3, 7)).unwrap();
    let outs = on_ranks(host(3), |r, t| {
        let rows = ulysses::rows(n, 3, r);
        ulysses::gather_rows(&Cpu, t.as_ref(), &Cpu.narrow(&x, 0, rows.start, rows.len()).unwrap(), n, 9).unwrap()
    });
    for o in outs {
        assert_eq!(o, Cpu.narrow(&x, 0, 0, 9).unwrap());
    }
}

#[test]
fn layouts_split_the_passes_then_the_heads() {
    assert_eq!(Layout::guided(2, 1).unwrap(), Layout { groups: 2, seq: 1 });
    assert_eq!(Layout::guided(8, 24).unwrap(), Layout { groups: 2, seq: 4 });
    assert_eq!(Layout::guided(3, 24).unwrap(), Layout { groups: 1, seq: 3 });
    assert!(Layout::guided(4, 1).unwrap_err().to_string().contains("1 head(s) do not divide by 2"));
    assert_eq!(Layout::unguided(4, 24).unwrap(), Layout { groups: 1, seq: 4 });
    assert_eq!(Layout::unguided(2, 1).unwrap(), Layout { groups: 2, seq: 1 });
}

#[test]
fn roles_follow_the_layout() {
    let eps = Endpoints::<Cpu>::make_all(4, super::host::make::<Cpu>).unwrap();
    let guided = Layout::guided(4, 2).unwrap();
    for (r, e) in eps.iter().enumerate() {
        let role = e.role(guided);
        assert_eq!((role.group, role.groups), (r / 2, 2));
        assert_eq!(role.cfg.map(|t| (t.rank(), t.ranks())), Some((r / 2, 2)));
        assert_eq!(role.seq.map(|t| (t.rank(), t.ranks())), Some((r % 2, 2)));
        let role = e.role(Layout::unguided(4, 4).unwrap());
        assert_eq!((role.groups, role.cfg.is_none()), (1, true));
        assert_eq!(role.seq.map(|t| (t.rank(), t.ranks())), Some((r, 4)));
    }
}

#[test]
fn the_crew_stops_together_and_a_failure_wakes_it() {
    let crew = Crew::new(3);
    let votes = on_ranks(vec![(); 3], |r, _| (0..4).map(|step| crew.any_stop(r == 1 && step == 2).unwrap()).collect::<Vec<_>>());
    for v in votes {
        assert_eq!(v, [false, false, true, false]);
    }
    let crew = Crew::new(3);
    let r = on_ranks(vec![(); 3], |r, _| {
        if r == 2 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            crew.fail();
            return Ok(false);
        }
        crew.any_stop(false)
    });
    assert!(r[0].is_err() && r[1].is_err());
}
