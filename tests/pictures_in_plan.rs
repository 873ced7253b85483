//! The memory plan of a run with a picture in (`plan::run::with_pictures_in`), with the CUDA
//! backend's activation formulas at FLUX.2's VAE widths: the encoder's stage is counted at the
//! init image's size, and at the hires fix's second-pass size for its Lanczos upscaler.

mod common;

use moss::plan::run::{networks, with_pictures_in};
use moss::spec::{HiresSpec, InitSpec, PictureSpec, Upscaler};

/// The VAE's activations (whole, and the least split) are the larger of the decode's and the
/// encode's at the picture's size; the Lanczos upscaler encodes at the second pass's size, the
/// latent upscaler encodes nothing; a picture from text plans the decode alone.
#[test]
fn the_encoder_stage_is_planned() {
    let mut ck = common::checkpoint("tiny-a");
    let budget = moss::backend::cpu_budget();
    let tiny = networks(&ck, &budget, 16, (64, 64)).unwrap();
    // FLUX.2's widths: the activations follow the config (the networks' weights stay tiny-a's).
    (ck.vae.block_out_channels, ck.vae.decoder_block_out_channels) = (vec![128, 256, 512, 512], vec![96, 192, 384, 384]);
    let act = budget.activations;
    let vae = |spec: &PictureSpec| {
        let (w, h) = spec.out_size();
        let mut nets = tiny.clone();
        let v = nets.iter_mut().find(|n| n.name == "vae").unwrap();
        let (whole, least) = act.vae_decode(&ck.vae, h as usize / 16, w as usize / 16);
        (v.activations, v.strip_activations) = (whole, Some(least));
        with_pictures_in(&mut nets, &ck, &budget, spec);
        let v = nets.iter().find(|n| n.name == "vae").unwrap();
        (v.activations, v.strip_activations.unwrap())
    };
    let (w, h) = (1024u32, 768u32);
    let text = PictureSpec { width: w, height: h, ..Default::default() };
    let (dec, dec_least) = vae(&text);
    let (enc, enc_least) = act.vae_encode(&ck.vae, h as usize, w as usize);
    println!("{w}x{h}: decode {dec} (least {dec_least}), encode {enc} (least {enc_least})");
    assert!(enc > dec || enc_least > dec_least, "the encode needs more than the decode somewhere: the case tells the stages apart");
    let init = InitSpec { sha256: "a".repeat(64), strength: 0.5, mask_sha256: None, mask_blur: None, outpaint: None };
    let from_picture = PictureSpec { init_image: Some(init), ..text.clone() };
    assert_eq!(vae(&from_picture), (dec.max(enc), dec_least.max(enc_least)));
    // The hires fix at 2x: the second pass is 2048x1536.
    let hires = |upscaler| PictureSpec { hires: Some(HiresSpec { scale: 2.0, strength: 0.5, steps: 4, upscaler }), ..text.clone() };
    let big = vae(&PictureSpec { width: 2 * w, height: 2 * h, ..Default::default() });
    assert_eq!(vae(&hires(Upscaler::Latent)), big);
    let (big_enc, big_enc_least) = act.vae_encode(&ck.vae, 2 * h as usize, 2 * w as usize);
    assert_eq!(vae(&hires(Upscaler::Lanczos)), (big.0.max(big_enc), big.1.max(big_enc_least)));
}
