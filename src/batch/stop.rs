//! Stopping on SIGINT / SIGTERM: the handler records the signal; the stages check it between
//! steps, prompts and pictures.

use std::sync::atomic::{AtomicI32, Ordering};

pub(super) static STOP: AtomicI32 = AtomicI32::new(0);

/// The signal that asked the batch to stop (2: SIGINT, 15: SIGTERM), if one did.
pub fn stop_signal() -> Option<i32> {
    match STOP.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Ask the running batch to stop after its current step, as a signal does.
pub fn request_stop(signal: i32) {
    let _ = STOP.compare_exchange(0, signal.max(1), Ordering::SeqCst, Ordering::SeqCst);
}

#[cfg(unix)]
mod signals {
    pub const SIGINT: i32 = 2;
    pub const SIGTERM: i32 = 15;
    const SIG_DFL: usize = 0;
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    extern "C" fn on_signal(sig: i32) {
        super::request_stop(sig);
        // A second signal kills at once (signal(2) is async-signal-safe).
        unsafe {
            signal(sig, SIG_DFL);
        }
    }
    pub fn install() {
        let h = on_signal as extern "C" fn(i32) as usize;
        unsafe {
            signal(SIGINT, h);
            signal(SIGTERM, h);
        }
    }
}

/// Make SIGINT and SIGTERM stop the batch cleanly (see the module notes).
pub fn install_stop_handler() {
    #[cfg(unix)]
    signals::install();
}
