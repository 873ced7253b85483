//! The machine-readable mark every picture carries that it was made by a generative model (the
//! EU AI Act's Article 50(2) asks providers for one): an XMP packet with IPTC's
//! `Iptc4xmpExt:DigitalSourceType` = `trainedAlgorithmicMedia` (IPTC's NewsCodes term for media
//! made by a model trained on sampled content) and the software that made it (`xmp:CreatorTool`).
//! [`crate::picture::encode`] writes it into every PNG (an iTXt chunk `XML:com.adobe.xmp`), JPEG
//! (an APP1 segment after the EXIF one) and WebP (the `XMP ` chunk).

/// IPTC's Digital Source Type for a picture a trained model made.
pub const DIGITAL_SOURCE_TYPE: &str = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia";

/// The PNG keyword of an XMP packet (XMP Specification Part 3, 1.1.5).
pub const PNG_KEYWORD: &str = "XML:com.adobe.xmp";

/// `s` as XML attribute text.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The XMP packet of a picture made by `software` (e.g. `moss 0.1.0`).
pub fn xmp(software: &str) -> String {
    format!(
        "<?xpacket begin=\"\u{feff}\" id=\"W5M0MpCehiHzreSzNTczkc9d\"?>\n\
         <x:xmpmeta xmlns:x=\"adobe:ns:meta/\">\n \
         <rdf:RDF xmlns:rdf=\"http://www.w3.org/1999/02/22-rdf-syntax-ns#\">\n  \
         <rdf:Description rdf:about=\"\"\n    \
         xmlns:Iptc4xmpExt=\"http://iptc.org/std/Iptc4xmpExt/2008-02-29/\"\n    \
         xmlns:xmp=\"http://ns.adobe.com/xap/1.0/\"\n    \
         Iptc4xmpExt:DigitalSourceType=\"{DIGITAL_SOURCE_TYPE}\"\n    \
         xmp:CreatorTool=\"{}\"/>\n \
         </rdf:RDF>\n\
         </x:xmpmeta>\n\
         <?xpacket end=\"r\"?>",
        escape(software)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packet_names_the_source_type_and_the_software() {
        let x = xmp("moss <1.0> & \"co\"");
        assert!(x.starts_with("<?xpacket begin=\"\u{feff}\"") && x.ends_with("<?xpacket end=\"r\"?>"), "{x}");
        assert!(x.contains(&format!("Iptc4xmpExt:DigitalSourceType=\"{DIGITAL_SOURCE_TYPE}\"")), "{x}");
        assert!(x.contains("xmp:CreatorTool=\"moss &lt;1.0&gt; &amp; &quot;co&quot;\""), "{x}");
    }
}
