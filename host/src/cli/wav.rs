//! WAV files for `voicehost call`'s audio: the caller's audio read from any PCM or float WAV (mixed to mono,
//! resampled), the agent's written as 16-bit mono. Through `hound`.

use anyhow::{bail, Context as _, Result};
use std::path::Path;
use std::time::Duration;

/// The caller's audio from `path` as 16-bit little-endian mono samples at `rate` Hz: channels mixed,
/// resampled by linear interpolation. Refused past `most` of audio (at the file's own rate, before any
/// sample is kept).
pub fn read(path: &Path, rate: u32, most: Duration) -> Result<Vec<u8>> {
    let reader = hound::WavReader::open(path)
        .with_context(|| format!("--audio {}: not a WAV file this can read", path.display()))?;
    let spec = reader.spec();
    let channels = usize::from(spec.channels.max(1));
    let frames = u64::from(reader.duration());
    if spec.sample_rate == 0 || frames > most.as_secs() * u64::from(spec.sample_rate) {
        bail!(
            "--audio {}: {} s of audio at {} Hz; a call takes at most {} s",
            path.display(),
            frames / u64::from(spec.sample_rate.max(1)),
            spec.sample_rate,
            most.as_secs()
        );
    }
    let samples: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader
            .into_samples::<f32>()
            .collect::<Result<_, _>>()
            .with_context(|| format!("--audio {}", path.display()))?,
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            reader
                .into_samples::<i32>()
                .map(|s| s.map(|s| s as f32 * scale))
                .collect::<Result<_, _>>()
                .with_context(|| format!("--audio {}", path.display()))?
        }
    };
    let mono: Vec<f32> = samples
        .chunks(channels)
        .map(|frame| frame.iter().sum::<f32>() / frame.len() as f32)
        .collect();
    Ok(resample(&mono, spec.sample_rate, rate)
        .into_iter()
        .flat_map(|s| ((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes())
        .collect())
}

/// `samples` at `from` Hz as samples at `to` Hz, each interpolated linearly between its two neighbours.
fn resample(samples: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || samples.is_empty() {
        return samples.to_vec();
    }
    let count = (samples.len() as u64 * u64::from(to) / u64::from(from)) as usize;
    let step = f64::from(from) / f64::from(to);
    (0..count)
        .map(|i| {
            let at = i as f64 * step;
            let left = at.floor() as usize;
            let right = (left + 1).min(samples.len() - 1);
            let part = (at - left as f64) as f32;
            samples[left] * (1.0 - part) + samples[right] * part
        })
        .collect()
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
        let up = resample(&[0.0, 1.0], 8000, 16000);
        assert_eq!(up, vec![0.0, 0.5, 1.0, 1.0]);
        assert_eq!(resample(&[0.0; 480], 48000, 16000).len(), 160);
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
