//! `--c2pa-cert` and `--c2pa-key` (generate, batch mode, serve): the flags mapped onto the
//! library's signer, the one place that does.

use clap::Args;
use moss::c2pa_manifest::ManifestSigner;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug, Clone, Default)]
pub struct C2paArgs {
    /// Sign every picture with a C2PA manifest (Content Credentials): this PEM certificate chain,
    /// the signing certificate first (with --c2pa-key).
    #[arg(long, value_name = "FILE")]
    pub c2pa_cert: Option<PathBuf>,
    /// The PKCS#8 PEM private key of --c2pa-cert's certificate (EC P-256/P-384/P-521, Ed25519 or
    /// RSA; the signing algorithm follows the key).
    #[arg(long, value_name = "FILE")]
    pub c2pa_key: Option<PathBuf>,
}

impl C2paArgs {
    /// The checked signer, or none without the flags; one flag alone, a file that does not read,
    /// a certificate C2PA refuses or a key that is not the certificate's is an error (said before
    /// any model work).
    pub fn signer(&self) -> anyhow::Result<Option<Arc<ManifestSigner>>> {
        match (&self.c2pa_cert, &self.c2pa_key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(Arc::new(ManifestSigner::from_files(cert, key)?))),
            (Some(_), None) => anyhow::bail!("--c2pa-cert needs --c2pa-key (the certificate's private key): give both, or neither"),
            (None, Some(_)) => anyhow::bail!("--c2pa-key needs --c2pa-cert (the key's certificate chain): give both, or neither"),
        }
    }
}
