//! `POST /v1/images/edits`: OpenAI's multipart/form-data edits request (`image`, one file;
//! `mask`; `prompt`, `n`, `size`, `response_format`, `output_format`, `model`), with the
//! generations' extensions (`seed`, `num_inference_steps`, `guidance_scale`, `negative_prompt`,
//! `stream`, `lora`) and the picture-in ones (`strength`, `mask_blur`). It renders what
//! `moss generate --init-image IMAGE --mask MASK` renders with the same settings, through the same
//! pictures-in code ([`crate::pipeline::PicturesIn`]): the same defaults (strength 0.75, mask
//! blur 4, the picture's own size when `size` is absent or `auto`), so the same bytes.
//!
//! The form's text fields become the values a JSON body would hold (numbers and booleans as
//! JSON reads them) and go through the generations' checks; the pictures are decoded under the
//! input limits (`crate::picture_in`): not a picture, a picture too large to decode, a mask of
//! another size are 400s naming the field; a body past `--max-upload` is a 413.

use super::api::{self, ApiError, Generation, Limits};
use crate::pipeline::{Input, PicturesIn, Request};
use axum::extract::multipart::{Multipart, MultipartError};
use axum::http::StatusCode;
use serde_json::{Map, Value};

/// The form's text fields moss reads, besides the generations' ([`api::FIELDS`]).
pub const FIELDS: [&str; 2] = ["strength", "mask_blur"];
/// OpenAI's edits fields moss has no use for: accepted and ignored.
pub const IGNORED: [&str; 3] = ["input_fidelity", "safety_identifier", "complexity"];
/// Text fields whose value is read as JSON reads it (a number, a boolean): the rest are strings.
const TYPED: [&str; 8] = ["n", "seed", "num_inference_steps", "guidance_scale", "stream", "partial_images", "strength", "mask_blur"];

/// The request as read from the form: the pictures' bytes and the text fields.
#[derive(Default)]
pub struct Form {
    pub image: Option<Vec<u8>>,
    pub mask: Option<Vec<u8>>,
    pub fields: Map<String, Value>,
}

fn form_error(e: MultipartError) -> ApiError {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(status, "request_too_large", "the request body is above this server's limit (--max-upload)");
    }
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_multipart", format!("the multipart/form-data body does not read: {}", e.body_text()))
}

/// Read every part of the form: `image` (or `image[]`, OpenAI's list spelling, with one file) and
/// `mask` as bytes, the rest as text fields. A field given twice is refused.
pub async fn read(mut m: Multipart) -> Result<Form, ApiError> {
    let mut f = Form::default();
    while let Some(part) = m.next_field().await.map_err(form_error)? {
        let name = part.name().unwrap_or_default().to_string();
        match name.as_str() {
            "image" | "image[]" => {
                let bytes = part.bytes().await.map_err(form_error)?;
                if f.image.replace(bytes.to_vec()).is_some() {
                    return Err(ApiError::bad("image", "invalid_value", "`image`: moss edits one picture; the request holds several"));
                }
            }
            "mask" => {
                let bytes = part.bytes().await.map_err(form_error)?;
                if f.mask.replace(bytes.to_vec()).is_some() {
                    return Err(ApiError::bad("mask", "invalid_value", "`mask` is given twice"));
                }
            }
            "" => return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_multipart", "a form part has no name")),
            _ => {
                let text = part.text().await.map_err(form_error)?;
                let v = if TYPED.contains(&name.as_str()) { serde_json::from_str(text.trim()).unwrap_or(Value::String(text)) } else { Value::String(text) };
                if f.fields.insert(name.clone(), v).is_some() {
                    return Err(ApiError::bad(&name, "invalid_value", format!("`{name}` is given twice")));
                }
            }
        }
    }
    Ok(f)
}

/// The generation the form asks for over `base`: the generations' checks, then the pictures read
/// and put at the picture's size ([`PicturesIn::prepare`]). CPU work (decoding, resizing): run
/// it off the server's async threads.
pub fn parse(form: Form, lim: &Limits, models: &[&str], base: &Request, random_seed: u64) -> Result<Generation, ApiError> {
    let fields: Vec<&str> = api::FIELDS.iter().chain(&FIELDS).copied().collect();
    let ignored: Vec<&str> = api::IGNORED.iter().chain(&IGNORED).copied().collect();
    api::check_known(&form.fields, &fields, &ignored)?;
    let get = |k: &str| form.fields.get(k).filter(|v| !v.is_null());
    let own_size = matches!(get("size").and_then(Value::as_str), None | Some("auto"));
    // The picture's own size replaces the default below (checked against --max-size there).
    let base = match own_size {
        true => Request { spec: crate::spec::PictureSpec { width: 16, height: 16, ..base.spec.clone() }, ..base.clone() },
        false => base.clone(),
    };
    let mut g = api::parse_fields(&form.fields, lim, models, &base, random_seed)?;
    let number = |k: &str| -> Result<Option<f64>, ApiError> {
        get(k).map(|v| v.as_f64().ok_or_else(|| ApiError::bad(k, "invalid_type", format!("`{k}` must be a number, got {v}")))).transpose()
    };
    let strength = number("strength")?.unwrap_or(crate::spec::DEFAULT_STRENGTH);
    crate::spec::check_strength("`strength`", strength).map_err(|e| ApiError::bad("strength", "invalid_value", e))?;
    let blur = match number("mask_blur")? {
        None => crate::spec::DEFAULT_MASK_BLUR,
        Some(b) if b.fract() == 0.0 && (0.0..=crate::spec::MAX_MASK_BLUR as f64).contains(&b) => b as u32,
        Some(b) => {
            return Err(ApiError::bad(
                "mask_blur",
                "invalid_value",
                format!("`mask_blur` {b} is not a whole number of pixels in 0..={}", crate::spec::MAX_MASK_BLUR),
            ))
        }
    };
    let bad_picture = |param: &str, e: anyhow::Error| ApiError::bad(param, "invalid_image", format!("{e:#}"));
    let Some(image) = &form.image else { return Err(ApiError::bad("image", "missing_required_parameter", "`image` is required (a PNG, JPEG or WebP file)")) };
    let image = Input::from_bytes(image, "`image`", None).map_err(|e| bad_picture("image", e))?;
    let mask = form.mask.as_deref().map(|m| Input::from_bytes(m, "`mask`", None)).transpose().map_err(|e| bad_picture("mask", e))?;
    let pics = PicturesIn::new(image, mask).map_err(|e| bad_picture("mask", e))?;
    let spec = &mut g.req.spec;
    spec.init_image = Some(pics.spec(strength, blur, None));
    if own_size {
        (spec.width, spec.height) = pics.natural_size(None).map_err(|e| bad_picture("image", e))?;
    }
    let pixels = spec.width as u64 * spec.height as u64;
    if pixels > lim.max_pixels {
        let why = if get("size").is_some() { "" } else { " (the picture's size: give `size`)" };
        return Err(ApiError::bad(
            "size",
            "invalid_value",
            format!("size {}x{}{why} is above this server's limit of {} pixels (--max-size)", spec.width, spec.height, lim.max_pixels),
        ));
    }
    crate::spec::check_inpaint_sampler(spec.sampler, spec.init_image.as_ref().is_some_and(|i| i.masked()))
        .map_err(|e| ApiError::bad("sampler", "invalid_value", e))?;
    spec.check().map_err(|e| ApiError::bad("image", "invalid_value", e))?;
    let prepared = pics.prepare(spec).map_err(|e| ApiError::internal(format!("{e:#}")))?;
    g.req.init = Some(std::sync::Arc::new(prepared));
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Precision;

    fn png(img: image::DynamicImage) -> Vec<u8> {
        let mut out = std::io::Cursor::new(vec![]);
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    fn form(image: Option<Vec<u8>>, mask: Option<Vec<u8>>, fields: &[(&str, Value)]) -> Form {
        Form { image, mask, fields: fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() }
    }

    fn parse_form(f: Form) -> Result<Generation, ApiError> {
        let lim = Limits { max_steps: 100, max_pixels: 256 * 256, max_tokens: 4096, dit_blocks: 4, previews: true, devices: 1 };
        parse(f, &lim, &["m"], &api::base_request(vec![22], (0.0, 1.0), 4096, Precision::Bf16), 5)
    }

    #[test]
    fn defaults_are_generates() {
        let img = png(image::DynamicImage::new_rgb8(48, 80));
        let g = parse_form(form(Some(img.clone()), None, &[("prompt", "a cat".into())])).unwrap();
        let init = g.req.spec.init_image.as_ref().unwrap();
        assert_eq!((g.req.spec.width, g.req.spec.height), (48, 80), "the picture's own size");
        assert_eq!((init.strength, init.mask_blur, init.sha256.as_str()), (0.75, None, crate::pipeline::sha256_hex(&img).as_str()));
        let mask = png(image::DynamicImage::new_luma8(48, 80));
        let g = parse_form(form(Some(img.clone()), Some(mask), &[("prompt", "x".into()), ("size", "64x64".into()), ("strength", 0.5.into())])).unwrap();
        let init = g.req.spec.init_image.as_ref().unwrap();
        assert_eq!((g.req.spec.width, init.strength, init.mask_blur), (64, 0.5, Some(4)));
        assert_eq!(g.req.init.as_ref().unwrap().width, 64);
    }

    #[test]
    fn refusals_name_the_field() {
        let img = png(image::DynamicImage::new_rgb8(48, 80));
        let p = ("prompt", Value::from("x"));
        let cases: Vec<(Form, u16, &str)> = vec![
            (form(None, None, std::slice::from_ref(&p)), 400, "image"),
            (form(Some(b"not a picture".to_vec()), None, std::slice::from_ref(&p)), 400, "image"),
            (form(Some(img.clone()), Some(png(image::DynamicImage::new_luma8(16, 16))), std::slice::from_ref(&p)), 400, "mask"),
            (form(Some(img.clone()), Some(b"GIF89a".to_vec()), std::slice::from_ref(&p)), 400, "mask"),
            (form(Some(img.clone()), None, &[p.clone(), ("strength", 0.0.into())]), 400, "strength"),
            (form(Some(img.clone()), None, &[p.clone(), ("strength", "lots".into())]), 400, "strength"),
            (form(Some(img.clone()), None, &[p.clone(), ("mask_blur", 2.5.into())]), 400, "mask_blur"),
            (form(Some(img.clone()), None, &[p.clone(), ("size", "512x512".into())]), 400, "size"),
            (form(Some(png(image::DynamicImage::new_rgb8(512, 512))), None, std::slice::from_ref(&p)), 400, "size"),
            (form(Some(png(image::DynamicImage::new_rgb8(8, 8))), None, std::slice::from_ref(&p)), 400, "image"),
            (form(Some(img.clone()), None, &[p.clone(), ("colour", "red".into())]), 400, "colour"),
            (form(Some(img), None, &[]), 400, "prompt"),
        ];
        for (f, status, param) in cases {
            let e = parse_form(f).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref().unwrap_or("")), (status, param), "{e:?}");
        }
    }
}
