//! WAV files for `voicehost call`'s audio: the caller's audio read from any PCM or float WAV (mixed to mono,
//! resampled), the agent's written as 16-bit mono. Through `hound`.

use anyhow::{bail, Context as _, Result};
use std::path::Path;
use std::time::Duration;

/// The sample rates a caller's file may have: below is no voice, above no audio interface.
const RATES: std::ops::RangeInclusive<u32> = 4000..=384_000;

/// The caller's audio from `path` as 16-bit little-endian mono samples at `rate` Hz: channels mixed,
/// resampled by linear interpolation, read and converted as a stream (what is kept is the result, at most
/// `most` of it at `rate`: 86 MB for 30 minutes at 24 kHz). Refused past `most` of audio, before any
/// sample is read; refused when it holds none.
pub fn read(path: &Path, rate: u32, most: Duration) -> Result<Vec<u8>> {
    let name = path.display();
    let file = std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?;
    let reader = hound::WavReader::new(std::io::BufReader::new(file))
        .with_context(|| format!("{name}: not a WAV file this can read"))?;
    let spec = reader.spec();
    if !RATES.contains(&spec.sample_rate) {
        bail!(
            "{name}: a sample rate of {} Hz; a caller's audio is {} to {} Hz",
            spec.sample_rate,
            RATES.start(),
            RATES.end()
        );
    }
    let channels = usize::from(spec.channels.max(1));
    let frames = u64::from(reader.duration());
    let seconds = frames as f64 / f64::from(spec.sample_rate);
    if frames > most.as_secs() * u64::from(spec.sample_rate) {
        bail!(
            "{name}: {seconds:.1} s of audio; at most {} s is taken here",
            most.as_secs()
        );
    }
    if frames * u64::from(rate) / u64::from(spec.sample_rate) == 0 {
        bail!("{name}: the file holds no audio ({seconds:.3} s)");
    }
    let mut samples: Box<dyn Iterator<Item = hound::Result<f32>>> = match spec.sample_format {
        hound::SampleFormat::Float => Box::new(reader.into_samples::<f32>()),
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            Box::new(
                reader
                    .into_samples::<i32>()
                    .map(move |s| s.map(|s| s as f32 * scale)),
            )
        }
    };
    let mut failure = None;
    // One mono sample per frame of the file: its channels' mean. A read error ends the stream; it is
    // reported below.
    let mono = std::iter::from_fn(|| {
        let mut sum = 0.0;
        for _ in 0..channels {
            match samples.next()? {
                Ok(sample) => sum += sample,
                Err(error) => {
                    failure = Some(error);
                    return None;
                }
            }
        }
        Some(sum / channels as f32)
    });
    let audio: Vec<u8> = resample(mono, frames, spec.sample_rate, rate)
        .flat_map(|s| ((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes())
        .collect();
    if let Some(error) = failure {
        return Err(error).with_context(|| format!("{name}: the file is damaged"));
    }
    Ok(audio)
}

/// `frames` samples at `from` Hz as samples at `to` Hz, each interpolated linearly between its two
/// neighbours (the last repeated past the end); a stream in, a stream out.
fn resample(
    mut samples: impl Iterator<Item = f32>,
    frames: u64,
    from: u32,
    to: u32,
) -> impl Iterator<Item = f32> {
    let count = frames * u64::from(to) / u64::from(from);
    let step = f64::from(from) / f64::from(to);
    let mut left = samples.next().unwrap_or(0.0);
    let mut right = samples.next().unwrap_or(left);
    let mut at_left = 0u64;
    (0..count).map(move |i| {
        let at = i as f64 * step;
        let index = at.floor() as u64;
        while at_left < index {
            left = right;
            right = samples.next().unwrap_or(left);
            at_left += 1;
        }
        let part = (at - index as f64) as f32;
        left * (1.0 - part) + right * part
    })
}

/// Writes 16-bit little-endian mono `samples` at `rate` Hz to `path` as a WAV file.
pub fn write(path: &Path, rate: u32, samples: &[u8]) -> Result<()> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec)?;
    for pair in samples.chunks_exact(2) {
        writer.write_sample(i16::from_le_bytes([pair[0], pair[1]]))?;
    }
    writer.finalize()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resampling_keeps_the_duration_and_the_line_between_samples() {
        let up: Vec<f32> = resample([0.0, 1.0].into_iter(), 2, 8000, 16000).collect();
        assert_eq!(up, vec![0.0, 0.5, 1.0, 1.0]);
        let down = resample(std::iter::repeat_n(0.25, 480), 480, 48000, 16000);
        assert_eq!(down.collect::<Vec<_>>(), vec![0.25; 160]);
    }

    #[test]
    fn a_written_file_reads_back_as_the_same_samples() {
        let dir = std::env::temp_dir().join(format!("voicehost-wav-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tone.wav");
        let samples: Vec<u8> = (0..320i16).flat_map(|s| (s * 50).to_le_bytes()).collect();
        write(&path, 16000, &samples).unwrap();
        let read_back = read(&path, 16000, Duration::from_secs(1)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read_back, samples);
    }
}

#[cfg(test)]
mod refusals {
    use super::*;

    fn file(name: &str, rate: u32, samples: usize) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("voicehost-wav-refusals-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        write(&path, rate, &vec![0u8; samples * 2]).unwrap();
        path
    }

    #[test]
    fn a_file_without_audio_is_refused_not_played_forever() {
        let error = read(&file("empty.wav", 16000, 0), 16000, Duration::from_secs(1)).unwrap_err();
        assert!(format!("{error:#}").contains("holds no audio"), "{error:#}");
    }

    #[test]
    fn a_rate_no_voice_has_is_refused_before_resampling() {
        let error = read(&file("slow.wav", 1, 10), 24000, Duration::from_secs(60)).unwrap_err();
        assert!(format!("{error:#}").contains("1 Hz"), "{error:#}");
    }
}
