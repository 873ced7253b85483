//! cache-dit's `TaylorSeerState` (calibrators/taylorseer.py) on one pass's middle residual: the
//! full steps record `Y` and its finite differences `dY_i = (dY_{i−1} − dY_{i−1}^prev)/window`
//! up to the order; a cached step forecasts `Σ_i dY_i·e^i/i!`, `e` the steps since the last full
//! one. As in cache-dit the state is made by its first update, and counts steps only from the
//! next one (so its step index trails the pass's by one, and the differences start at the
//! fourth full step): that is what decides which terms exist, so it is kept.

use super::store::{axpy, sub};
use crate::backend::ops::DitOps;
use anyhow::Result;

pub struct Taylor<B: DitOps> {
    order: usize,
    /// None until the first update.
    state: Option<State<B>>,
}

struct State<B: DitOps> {
    current_step: i64,
    last_full: i64,
    prev: Vec<Option<B::T>>,
    cur: Vec<Option<B::T>>,
}

impl<B: DitOps> Taylor<B> {
    pub fn new(order: usize) -> Self {
        Taylor { order, state: None }
    }

    /// `mark_step_begin` (only once the state exists).
    pub fn begin_step(&mut self) {
        if let Some(s) = &mut self.state {
            s.current_step += 1;
        }
    }

    /// A full step's middle residual `y`.
    pub fn update(&mut self, b: &B, y: B::T) -> Result<()> {
        let n = self.order + 1;
        let s = self.state.get_or_insert_with(|| State { current_step: -1, last_full: -1, prev: vec![None; n], cur: vec![None; n] });
        s.prev = std::mem::replace(&mut s.cur, vec![None; n]);
        let window = (s.current_step - s.last_full) as f32;
        s.cur[0] = Some(y);
        for i in 0..self.order {
            match (&s.prev[i], s.current_step > 1) {
                (Some(p), true) => {
                    let d = sub(b, s.cur[i].as_ref().expect("filled in order"), p)?;
                    let zero = sub(b, &d, &d)?;
                    s.cur[i + 1] = Some(axpy(b, &zero, &d, 1.0 / window)?);
                }
                _ => break,
            }
        }
        s.last_full = s.current_step;
        Ok(())
    }

    /// The forecast for the current step.
    pub fn approximate(&self, b: &B) -> Result<B::T> {
        let s = self.state.as_ref().expect("a full step came first");
        let elapsed = (s.current_step - s.last_full) as f64;
        let mut out = s.cur[0].clone().expect("a full step recorded Y");
        let mut fact = 1.0f64;
        for (i, d) in s.cur.iter().enumerate().skip(1) {
            let Some(d) = d else { break };
            fact *= i as f64;
            out = axpy(b, &out, d, (elapsed.powi(i as i32) / fact) as f32)?;
        }
        Ok(out)
    }
}
