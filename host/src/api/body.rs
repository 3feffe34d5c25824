//! Reading a request's body under a size cap and a deadline, piece by piece: into one buffer (a JSON
//! body), or into a file (an upload, [`spool`]). Each piece hyper hands over can pin a whole read buffer
//! of its own, so keeping the pieces (as collecting does) would let a client that sends one byte at a time
//! make the host hold kilobytes per byte.

use crate::content::{Spool, Spooled};
use axum::body::HttpBody as _;
use axum::body::{Body, Bytes};
use http_body_util::BodyExt as _;
use std::time::Duration;

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// More than the cap.
    TooLarge,
    /// Not all of it arrived before the deadline.
    TooSlow,
    /// The connection broke off: why.
    BrokenOff(String),
    /// The host could not write it down (an upload's file): why.
    Unwritable(String),
}

/// The whole body, if it is at most `cap` bytes and arrives within `deadline`.
pub async fn read(body: Body, cap: usize, deadline: Duration) -> Result<Bytes, BodyError> {
    let mut pieces = Pieces::of(body, cap as u64)?;
    // Sized from what the client declared, never past the cap.
    let mut whole =
        bytes::BytesMut::with_capacity(pieces.declared.unwrap_or(0).min(cap as u64) as usize);
    within(deadline, async {
        while let Some(piece) = pieces.next().await? {
            whole.extend_from_slice(&piece);
        }
        Ok(whole.freeze())
    })
    .await
}

/// The whole body received into `spool` (an upload's file: never held in memory), if it is at most `cap`
/// bytes and arrives within `deadline`. On an error the spool is dropped, and its file with it.
pub async fn spool(
    body: Body,
    cap: u64,
    deadline: Duration,
    mut spool: Spool,
) -> Result<Spooled, BodyError> {
    let unwritable = |e: std::io::Error| BodyError::Unwritable(e.to_string());
    let mut pieces = Pieces::of(body, cap)?;
    within(deadline, async {
        while let Some(piece) = pieces.next().await? {
            spool.write(&piece).await.map_err(unwritable)?;
        }
        spool.finish().await.map_err(unwritable)
    })
    .await
}

async fn within<T>(
    deadline: Duration,
    reading: impl std::future::Future<Output = Result<T, BodyError>>,
) -> Result<T, BodyError> {
    tokio::time::timeout(deadline, reading)
        .await
        .unwrap_or(Err(BodyError::TooSlow))
}

/// A body's data, piece by piece, refused once it passes `cap` bytes (at once when its declared length
/// does).
struct Pieces {
    body: Body,
    cap: u64,
    received: u64,
    declared: Option<u64>,
}

impl Pieces {
    fn of(body: Body, cap: u64) -> Result<Pieces, BodyError> {
        let declared = body.size_hint().exact();
        if declared.is_some_and(|n| n > cap) {
            return Err(BodyError::TooLarge);
        }
        Ok(Pieces {
            body,
            cap,
            received: 0,
            declared,
        })
    }

    /// The next piece of data; `None` at the end.
    async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(|e| BodyError::BrokenOff(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                self.received += data.len() as u64;
                if self.received > self.cap {
                    return Err(BodyError::TooLarge);
                }
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(pieces: Vec<&'static [u8]>) -> Body {
        let stream = futures_util::stream::iter(
            pieces
                .into_iter()
                .map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p))),
        );
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn a_body_in_pieces_is_read_whole_and_one_over_the_cap_is_refused() {
        let body = streamed(vec![b"ab", b"c", b"def"]);
        assert_eq!(
            read(body, 6, Duration::from_secs(5)).await.unwrap(),
            &b"abcdef"[..]
        );
        let body = streamed(vec![b"ab", b"c", b"defg"]);
        assert_eq!(
            read(body, 6, Duration::from_secs(5)).await,
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            read(Body::from("too long"), 3, Duration::from_secs(5)).await,
            Err(BodyError::TooLarge)
        );
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_given_up_at_the_deadline() {
        let stream = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
        assert_eq!(
            read(Body::from_stream(stream), 10, Duration::from_millis(50)).await,
            Err(BodyError::TooSlow)
        );
    }
}
