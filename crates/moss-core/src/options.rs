//! Options the library itself needs (precision, picture size limits), independent of any command
//! line: `cli` maps flags onto these, `pipeline`, `batch` and the backends read them.

/// Largest picture side, in pixels.
pub const MAX_SIDE: u32 = 4096;

/// GPU compute precision.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Precision {
    /// bf16 weights and residual stream, fp32 reductions (what the model was made for).
    Bf16,
    /// fp32 everywhere (verification; slower, twice the memory).
    Fp32,
    /// The DiT's main-block linears in float8 e4m3 with per-output-channel weight scales and
    /// per-token activation scales ([`crate::fp8`]); everything else bf16 (the text encoder, the
    /// refiner, embedders, modulation, final linear, attention, norms; the VAE stays fp32).
    Fp8,
    /// The same main-block linears as int8 with per-output-row weight scales and per-token
    /// activation scales, exact int32 accumulation ([`crate::int8`]; compute capability 8.0 and
    /// newer); everything else as at fp8.
    Int8,
}

impl Precision {
    /// The names `FromStr` accepts, in the order `--help` lists them.
    pub const NAMES: [&'static str; 4] = ["bf16", "fp32", "fp8", "int8"];

    /// The precision the text encoder runs at: an fp8 or int8 run encodes in bf16 (its hidden
    /// states are the bf16 run's), the others at their own.
    pub fn encoder(self) -> Precision {
        match self {
            Precision::Fp8 | Precision::Int8 => Precision::Bf16,
            p => p,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" => Ok(Precision::Bf16),
            "fp32" => Ok(Precision::Fp32),
            "fp8" => Ok(Precision::Fp8),
            "int8" => Ok(Precision::Int8),
            _ => Err(format!("unknown precision `{s}` (use bf16, fp32, fp8 or int8)")),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
            Precision::Fp8 => "fp8",
            Precision::Int8 => "int8",
        })
    }
}

/// `WIDTHxHEIGHT`, both positive multiples of 16 and at most [`MAX_SIDE`].
pub fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(|| format!("size `{s}` is not WIDTHxHEIGHT"))?;
    let p = |v: &str| v.trim().parse::<u32>().map_err(|_| format!("size `{s}` is not WIDTHxHEIGHT"));
    let (w, h) = (p(w)?, p(h)?);
    check_size(w, h)?;
    Ok((w, h))
}

/// The size rule of [`parse_size`] for numbers already parsed.
pub fn check_size(w: u32, h: u32) -> Result<(), String> {
    for (name, v) in [("width", w), ("height", h)] {
        if v == 0 || v % 16 != 0 {
            return Err(format!("{name} {v} is not a positive multiple of 16"));
        }
        if v > MAX_SIDE {
            return Err(format!("{name} {v} is above the cap of {MAX_SIDE}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024x768"), Ok((1024, 768)));
        assert!(parse_size("1000x1024").unwrap_err().contains("multiple of 16"));
        assert!(parse_size("8192x1024").unwrap_err().contains("cap"));
        assert!(parse_size("0x16").is_err());
        assert!(parse_size("big").is_err());
    }

    #[test]
    fn precisions() {
        for n in Precision::NAMES {
            assert_eq!(n.parse::<Precision>().unwrap().to_string(), n);
        }
        assert!("fp16".parse::<Precision>().is_err());
    }
}
