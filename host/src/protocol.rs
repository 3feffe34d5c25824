//! The wire: the official codec (`sentdm_voice_agents::frames`, generated from the protocol's schemas) and
//! the binary audio header.

pub use sentdm_voice_agents::frames::{
    self, Frame, CONNECT_PATH, RETAINED_FRAMES, SUBPROTOCOL, UNCOUNTED,
};

/// Whether a session frame of this type counts towards `received` (Counting frames in the protocol).
pub fn counted(frame_type: &str) -> bool {
    !UNCOUNTED.contains(&frame_type)
}

/// The size of the stream number in front of the samples of a binary audio message.
pub const AUDIO_HEADER: usize = 2;

/// The stream number of a binary audio message, or `None` when it is too short to have one.
pub fn stream_of(message: &[u8]) -> Option<u16> {
    (message.len() >= AUDIO_HEADER).then(|| u16::from_be_bytes([message[0], message[1]]))
}
