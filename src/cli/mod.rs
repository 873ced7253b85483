//! The command line: clap's definitions (`args`), the mapping of `generate`'s flags onto the
//! library's picture spec (`generate`), and the terminal's progress bars (`bars`). Only the
//! binary sees this; the library never names it.

pub mod args;
pub mod bars;
pub mod bench;
pub mod c2pa_args;
pub mod from;
pub mod generate;
pub mod man;
pub mod pictures_in_args;
pub mod quantize;
pub mod sampling_args;
