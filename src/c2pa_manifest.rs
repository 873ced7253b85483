//! The signed C2PA manifest (`--c2pa-cert`, `--c2pa-key`): a Content Credentials manifest store
//! embedded in the picture by the `c2pa` crate (pure-Rust crypto), signed with the user's
//! certificate chain and private key.
//!
//! The manifest holds one `c2pa.actions` assertion: `c2pa.created` with IPTC's Digital Source
//! Type `trainedAlgorithmicMedia` ([`crate::provenance::DIGITAL_SOURCE_TYPE`]) and moss as the
//! software agent; the claim generator is moss and its version, the title the picture's file
//! name. It is added last, over the encoded picture with all of moss's metadata (the XMP packet,
//! the text chunks or EXIF block), so its hash covers the final bytes; the `c2pa` crate places it
//! in a `caBX` chunk after a PNG's IHDR, in APP11 segments of a JPEG, in a `C2PA` chunk of a WebP.
//! The picture's bytes without that chunk or those segments are the unsigned picture's.
//!
//! The algorithm follows the key: ES256/ES384/ES512 for a P-256/P-384/P-521 key, Ed25519, PS256
//! for an RSA key (2048 bits or more). Keys are PKCS#8 PEM (`BEGIN PRIVATE KEY`, what `openssl
//! genpkey` writes). [`ManifestSigner::from_pem`] checks everything before any model work: the key
//! parses, it matches the certificate's public key, and a trial signature passes the `c2pa`
//! crate's checks of the certificate (C2PA's certificate profile: X.509 v3, the digitalSignature
//! key usage, an extended key usage such as emailProtection or documentSigning, not self-signed).
//!
//! Signing is not deterministic: each manifest gets a fresh random label (`urn:c2pa:UUID`), and
//! PS256 draws a random salt. Two signings of one picture differ in the manifest only.

use crate::picture::Format;
use anyhow::{anyhow, bail, Context, Result};
use c2pa::SigningAlg;
use std::io::Cursor;
use std::path::Path;

/// The name and version moss signs as (claim generator and software agent).
pub const NAME: &str = "moss";
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A checked signer: the certificate chain and private key, and the algorithm the key gives.
pub struct ManifestSigner {
    signer: c2pa::BoxedSigner,
    alg: SigningAlg,
}

impl std::fmt::Debug for ManifestSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ManifestSigner({})", self.alg)
    }
}

/// The private key's signing algorithm, from its PKCS#8 algorithm identifier.
pub fn key_algorithm(key_pem: &[u8]) -> Result<SigningAlg> {
    use pkcs8::der::Decode;
    let text = std::str::from_utf8(key_pem).map_err(|_| anyhow!("not a PEM file (not text)"))?;
    let label = text.lines().map(str::trim).find(|l| l.starts_with("-----BEGIN ")).ok_or_else(|| anyhow!("not a PEM file (no BEGIN line)"))?;
    match label {
        "-----BEGIN PRIVATE KEY-----" => {}
        "-----BEGIN EC PRIVATE KEY-----" | "-----BEGIN RSA PRIVATE KEY-----" => {
            bail!("the key is in the old {} form; moss reads PKCS#8 (`openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`)", &label[11..label.len() - 5])
        }
        "-----BEGIN ENCRYPTED PRIVATE KEY-----" => bail!("the key is encrypted; moss reads an unencrypted PKCS#8 key (`openssl pkcs8 -in KEY -out PLAIN`)"),
        _ => bail!("no private key in it (its first block is `{label}`)"),
    }
    let doc = pkcs8::SecretDocument::from_pem(text).map_err(|e| anyhow!("the PKCS#8 block does not read: {e}"))?.1;
    let info = pkcs8::PrivateKeyInfo::from_der(doc.as_bytes()).map_err(|e| anyhow!("the PKCS#8 key does not read: {e}"))?;
    let curve = info.algorithm.parameters_oid().ok().map(|o| o.to_string());
    Ok(match (info.algorithm.oid.to_string().as_str(), curve.as_deref()) {
        ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7")) => SigningAlg::Es256,
        ("1.2.840.10045.2.1", Some("1.3.132.0.34")) => SigningAlg::Es384,
        ("1.2.840.10045.2.1", Some("1.3.132.0.35")) => SigningAlg::Es512,
        ("1.2.840.10045.2.1", c) => bail!("an EC key on curve {} (C2PA signs with P-256, P-384 or P-521)", c.unwrap_or("?")),
        ("1.3.101.112", _) => SigningAlg::Ed25519,
        ("1.2.840.113549.1.1.1", _) => SigningAlg::Ps256,
        (oid, _) => bail!("a key of algorithm {oid} (C2PA signs with EC P-256/P-384/P-521, Ed25519 or RSA keys)"),
    })
}

/// The DER certificates of a PEM chain, the signing certificate first.
fn certificates(cert_pem: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut certs = vec![];
    for pem in x509_parser::pem::Pem::iter_from_buffer(cert_pem) {
        let pem = pem.map_err(|e| anyhow!("not a PEM certificate chain: {e}"))?;
        if pem.label == "CERTIFICATE" {
            certs.push(pem.contents);
        }
    }
    if certs.is_empty() {
        bail!("no certificate in it (a PEM file of `BEGIN CERTIFICATE` blocks, the signing certificate first)");
    }
    for c in &certs {
        x509_parser::parse_x509_certificate(c).map_err(|e| anyhow!("a certificate does not read: {e}"))?;
    }
    Ok(certs)
}

impl ManifestSigner {
    /// Read and check `cert` (PEM chain) and `key` (PKCS#8 PEM); errors name the flag and file.
    pub fn from_files(cert: &Path, key: &Path) -> Result<ManifestSigner> {
        let (cn, kn) = (format!("--c2pa-cert {}", cert.display()), format!("--c2pa-key {}", key.display()));
        let c = std::fs::read(cert).with_context(|| format!("{cn}: cannot read it"))?;
        let k = std::fs::read(key).with_context(|| format!("{kn}: cannot read it"))?;
        Self::checked(&c, &k, &cn, &kn)
    }

    /// A signer from PEM bytes, checked as [`ManifestSigner::from_files`] checks them.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<ManifestSigner> {
        Self::checked(cert_pem, key_pem, "--c2pa-cert", "--c2pa-key")
    }

    /// The checks, each error naming `cn` (the certificate) or `kn` (the key): the key's
    /// algorithm, the key against the certificate, and a trial signature of a small picture (the
    /// `c2pa` crate's certificate checks).
    fn checked(cert_pem: &[u8], key_pem: &[u8], cn: &str, kn: &str) -> Result<ManifestSigner> {
        let alg = key_algorithm(key_pem).map_err(|e| anyhow!("{kn}: {e}"))?;
        let certs = certificates(cert_pem).map_err(|e| anyhow!("{cn}: {e}"))?;
        let signer = c2pa::create_signer::from_keys(cert_pem, key_pem, alg, None).map_err(|e| anyhow!("{kn}: not a usable {alg} key: {e}"))?;
        // The key signs; the signing certificate's public key must verify it.
        let probe = b"moss: does the key match the certificate?";
        let sig = signer.sign(probe).map_err(|e| anyhow!("{kn}: cannot sign with it: {e}"))?;
        let (_, leaf) = x509_parser::parse_x509_certificate(&certs[0]).map_err(|e| anyhow!("{cn}: {e}"))?;
        let validator = c2pa::crypto::raw_signature::validator_for_signing_alg(alg).ok_or_else(|| anyhow!("{kn}: {alg} keys are not supported"))?;
        if validator.validate(&sig, probe, leaf.public_key().raw).is_err() {
            bail!("{kn} does not match {cn}: the key is not the first certificate's (the signing certificate comes first in the chain)");
        }
        if leaf.subject().iter_organization().next().is_none() {
            bail!("{cn}: the signing certificate's subject has no organization (O=...), which C2PA readers name the signer by");
        }
        let s = ManifestSigner { signer, alg };
        let trial = crate::png::encode(&[0, 0, 0], 1, 1, &crate::png::Metadata::default())?;
        let signed = s.sign(&trial, Format::Png, "trial.png").map_err(|e| {
            anyhow!(
                "{cn}: the C2PA signature is refused ({e}); a C2PA signing certificate is X.509 v3, valid now, issued by a CA (not \
                 self-signed), with the digitalSignature key usage and an extended key usage such as emailProtection or documentSigning"
            )
        })?;
        let failures = failures(&signed, Format::Png).map_err(|e| anyhow!("{cn}: the trial manifest does not read back: {e}"))?;
        if !failures.is_empty() {
            bail!("{cn}: the trial manifest does not validate: {}", failures.join(", "));
        }
        Ok(s)
    }

    /// The signing algorithm (`es256`, `ed25519`, ...).
    pub fn alg(&self) -> SigningAlg {
        self.alg
    }

    /// `picture` (encoded as `format`) with a signed manifest embedded, titled `title`.
    pub fn sign(&self, picture: &[u8], format: Format, title: &str) -> Result<Vec<u8>> {
        let definition = serde_json::json!({
            "title": title,
            "claim_generator_info": [{ "name": NAME, "version": VERSION }],
        });
        let mut b = c2pa::Builder::from_context(c2pa::Context::new()).with_definition(definition.to_string())?;
        b.add_action(serde_json::json!({
            "action": "c2pa.created",
            "digitalSourceType": crate::provenance::DIGITAL_SOURCE_TYPE,
            "softwareAgent": { "name": NAME, "version": VERSION },
        }))?;
        let mut out = Cursor::new(Vec::with_capacity(picture.len() + 16 * 1024));
        b.sign(self.signer.as_ref(), mime(format), &mut Cursor::new(picture), &mut out).map_err(|e| anyhow!("C2PA: cannot sign the {}: {e}", format.name()))?;
        Ok(out.into_inner())
    }
}

/// `picture` (the file for `out`, in its format) signed by `signer`, or as it is without one.
pub fn signed(signer: Option<&ManifestSigner>, picture: Vec<u8>, out: &Path) -> Result<Vec<u8>> {
    let Some(s) = signer else { return Ok(picture) };
    let format = Format::of(out)?;
    s.sign(&picture, format, &title(out, format))
}

/// The failure codes the `c2pa` crate's reader gives a signed picture, trust in the certificate's
/// issuer left aside (C2PA's trust lists are the reader's business, not the signer's).
pub fn failures(picture: &[u8], format: Format) -> Result<Vec<String>> {
    let context = c2pa::Context::new().with_settings(r#"{"verify": {"verify_trust": false}}"#)?;
    let reader = c2pa::Reader::from_context(context).with_stream(mime(format), Cursor::new(picture))?;
    let results = reader.validation_results().and_then(|r| r.active_manifest());
    Ok(results.map(|r| r.failure().iter().map(|s| s.code().to_string()).collect()).unwrap_or_default())
}

/// The media type the `c2pa` crate knows a format by.
pub fn mime(format: Format) -> &'static str {
    match format {
        Format::Png => "image/png",
        Format::Jpeg => "image/jpeg",
        Format::Webp => "image/webp",
    }
}

/// The manifest's title for a picture written to `out`: its file name; `picture.png` (or the
/// format's extension) for stdout and the server, which name no file.
pub fn title(out: &Path, format: Format) -> String {
    match out.file_name() {
        Some(n) if !crate::output::is_stdout(out) => n.to_string_lossy().into_owned(),
        _ => format!(
            "picture.{}",
            match format {
                Format::Png => "png",
                Format::Jpeg => "jpg",
                Format::Webp => "webp",
            }
        ),
    }
}
