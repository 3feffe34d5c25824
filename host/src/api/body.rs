//! Reading a request's body under a size cap and a deadline, copied piece by piece into one buffer: each
//! piece hyper hands over can pin a whole read buffer of its own, so keeping the pieces (as collecting
//! does) lets a client that sends one byte at a time make the host hold kilobytes per byte.

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
}

/// The whole body, if it is at most `cap` bytes and arrives within `deadline`.
pub async fn read(body: Body, cap: usize, deadline: Duration) -> Result<Bytes, BodyError> {
    let declared = body
        .size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(BodyError::TooLarge);
    }
    let reading = async {
        // Sized from what the client declared, never past the cap.
        let mut whole = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(cap));
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::BrokenOff(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                if whole.len() + data.len() > cap {
                    return Err(BodyError::TooLarge);
                }
                whole.extend_from_slice(data);
            }
        }
        Ok(whole.freeze())
    };
    tokio::time::timeout(deadline, reading)
        .await
        .unwrap_or(Err(BodyError::TooSlow))
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
