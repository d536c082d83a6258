//! The `audio` of an alert message: a short WAV (8 kHz, 16-bit, mono) with a tone pattern
//! per alert type that intercoms and radio gateways can play as is. Warn: two slow
//! 660/880 Hz beeps. Alarm: a fast 1000/1400 Hz warble. Made once, in process.

use std::io::Cursor;
use std::sync::OnceLock;

use super::rules::AlertType;

const RATE_HZ: u32 = 8_000;

/// (frequency Hz, milliseconds); frequency 0 is silence.
fn pattern(kind: AlertType) -> &'static [(f64, u32)] {
    match kind {
        AlertType::Monitor => &[],
        AlertType::Warn => {
            &[(660.0, 250), (0.0, 100), (880.0, 250), (0.0, 400), (660.0, 250), (0.0, 100), (880.0, 250)]
        }
        AlertType::Alarm => &[
            (1000.0, 120),
            (1400.0, 120),
            (1000.0, 120),
            (1400.0, 120),
            (1000.0, 120),
            (1400.0, 120),
            (1000.0, 120),
            (1400.0, 120),
            (0.0, 100),
            (1000.0, 120),
            (1400.0, 120),
            (1000.0, 120),
            (1400.0, 120),
        ],
    }
}

fn render(kind: AlertType) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: RATE_HZ,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut out = Cursor::new(Vec::new());
    if let Ok(mut w) = hound::WavWriter::new(&mut out, spec) {
        for (freq, ms) in pattern(kind) {
            let n = RATE_HZ * ms / 1000;
            for i in 0..n {
                let t = f64::from(i) / f64::from(RATE_HZ);
                // A 5 ms ramp at both ends: no clicks.
                let edge = (f64::from(i.min(n - 1 - i)) / 40.0).min(1.0);
                let v = if *freq > 0.0 { (2.0 * std::f64::consts::PI * freq * t).sin() * 0.6 * edge } else { 0.0 };
                let _ = w.write_sample((v * f64::from(i16::MAX)) as i16);
            }
        }
        let _ = w.finalize();
    }
    out.into_inner()
}

/// Base64 of the alert type's WAV (empty for Monitor, which is never published).
pub fn base64_wav(kind: AlertType) -> &'static str {
    use base64::Engine;
    static CACHE: OnceLock<[String; 3]> = OnceLock::new();
    let all = CACHE.get_or_init(|| {
        [AlertType::Monitor, AlertType::Warn, AlertType::Alarm].map(|k| {
            if k == AlertType::Monitor {
                String::new()
            } else {
                base64::engine::general_purpose::STANDARD.encode(render(k))
            }
        })
    });
    match kind {
        AlertType::Monitor => &all[0],
        AlertType::Warn => &all[1],
        AlertType::Alarm => &all[2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tones_are_playable_wav_files_that_differ_per_type() {
        for kind in [AlertType::Warn, AlertType::Alarm] {
            let wav = render(kind);
            let r = hound::WavReader::new(Cursor::new(&wav)).unwrap();
            assert_eq!((r.spec().sample_rate, r.spec().bits_per_sample, r.spec().channels), (8000, 16, 1));
            let ms: u32 = pattern(kind).iter().map(|p| p.1).sum();
            assert_eq!(r.duration(), 8 * ms);
            assert!(wav.len() < 40_000, "{} bytes", wav.len());
        }
        assert_ne!(base64_wav(AlertType::Warn), base64_wav(AlertType::Alarm));
        assert!(base64_wav(AlertType::Monitor).is_empty());
    }
}
