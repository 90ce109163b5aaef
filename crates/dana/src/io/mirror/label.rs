//! The label of one copy of a mirrored device: which group and copy it is,
//! the group's generation, and the state of every copy as last recorded.
//!
//! Owns: the byte layout of a label and its two slots at the start of
//! every copy (a copy's data begins after them, at [`LABEL_BYTES`]), and
//! the choice of the newest valid label. Never: performs I/O (the caller
//! reads and writes the blocks) or decides what a state change means.
//!
//! Layout of one label block (little endian; FORMAT.md has the table):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | crc32c of bytes 4..4096 |
//! | 4..8 | label version (1) |
//! | 8..16 | magic `DANAMIRR` |
//! | 16..20 | copies in the group |
//! | 20..24 | this copy's index |
//! | 24..32 | set id: random, the same in every copy of the group |
//! | 32..34 | role: 1 data device, 2 log |
//! | 34..36 | the device's index among data devices, or the log's |
//! | 40..48 | generation: raised by every recorded change of state |
//! | 48.. | per copy, 16 bytes: state (1 healthy, 2 failed, 3 rebuilding), 7 zero bytes, bytes rebuilt (rebuilding only) |
//!
//! A label is written to slot `generation % 2` (offset 0 or 4096) and
//! then synced, so a torn label write leaves the slot before it intact:
//! the valid slot with the higher generation is the copy's label.

use super::CopyState;

/// Bytes at the start of every copy that hold its two label slots.
pub const LABEL_BYTES: u64 = 8192;
/// Bytes of one label slot.
pub const SLOT_BYTES: usize = 4096;
/// Most copies in a group (a label holds every copy's state).
pub const MAX_COPIES: usize = 8;

const MAGIC: &[u8; 8] = b"DANAMIRR";
const VERSION: u32 = 1;
const STATES_AT: usize = 48;
const STATE_BYTES: usize = 16;

const _: () = assert!(STATES_AT + MAX_COPIES * STATE_BYTES <= SLOT_BYTES);
const _: () = assert!(LABEL_BYTES as usize == 2 * SLOT_BYTES);

/// What a mirrored device holds: a data device of the array or a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Data device `i` of the array (pages `p` with `p % width == i`).
    Data(usize),
    /// Log `i` of the database.
    Log(usize),
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Data(i) => write!(f, "data device {i}"),
            Role::Log(i) => write!(f, "log {i}"),
        }
    }
}

/// One decoded label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// Identity of the group (every copy carries the same).
    pub set_id: u64,
    /// What the group holds.
    pub role: Role,
    /// The copy this label was read from (or is written to).
    pub copy: usize,
    /// Raised by every recorded change of state.
    pub generation: u64,
    /// The state of every copy of the group, as recorded.
    pub states: Vec<CopyState>,
}

impl Label {
    /// The slot (0 or 1) this label goes to.
    pub fn slot(&self) -> usize {
        (self.generation % 2) as usize
    }

    /// Encodes the label into one slot's block.
    pub fn encode(&self) -> [u8; SLOT_BYTES] {
        assert!(
            (2..=MAX_COPIES).contains(&self.states.len()) && self.copy < self.states.len(),
            "a label of copy {} of {} copies",
            self.copy,
            self.states.len()
        );
        let mut b = [0u8; SLOT_BYTES];
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(MAGIC);
        b[16..20].copy_from_slice(&(self.states.len() as u32).to_le_bytes());
        b[20..24].copy_from_slice(&(self.copy as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.set_id.to_le_bytes());
        let (kind, index) = match self.role {
            Role::Data(i) => (1u16, i),
            Role::Log(i) => (2u16, i),
        };
        b[32..34].copy_from_slice(&kind.to_le_bytes());
        b[34..36].copy_from_slice(&(index as u16).to_le_bytes());
        b[40..48].copy_from_slice(&self.generation.to_le_bytes());
        for (i, s) in self.states.iter().enumerate() {
            let at = STATES_AT + i * STATE_BYTES;
            let (code, done) = match *s {
                CopyState::Healthy => (1u8, 0),
                CopyState::Failed => (2, 0),
                CopyState::Rebuilding { done } => (3, done),
            };
            b[at] = code;
            b[at + 8..at + 16].copy_from_slice(&done.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[4..]);
        b[0..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one slot's block; `None` if it is not a valid label (never
    /// written, torn, or damaged).
    pub fn decode(b: &[u8]) -> Option<Label> {
        if b.len() < SLOT_BYTES {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        if &b[8..16] != MAGIC
            || u32_at(4) != VERSION
            || u32_at(0) != crc32c::crc32c(&b[4..SLOT_BYTES])
        {
            return None;
        }
        let copies = u32_at(16) as usize;
        let copy = u32_at(20) as usize;
        if !(2..=MAX_COPIES).contains(&copies) || copy >= copies {
            return None;
        }
        let index = u16::from_le_bytes([b[34], b[35]]) as usize;
        let role = match u16::from_le_bytes([b[32], b[33]]) {
            1 => Role::Data(index),
            2 => Role::Log(index),
            _ => return None,
        };
        let mut states = Vec::with_capacity(copies);
        for i in 0..copies {
            let at = STATES_AT + i * STATE_BYTES;
            states.push(match b[at] {
                1 => CopyState::Healthy,
                2 => CopyState::Failed,
                3 => CopyState::Rebuilding {
                    done: u64_at(at + 8),
                },
                _ => return None,
            });
        }
        Some(Label {
            set_id: u64_at(24),
            role,
            copy,
            generation: u64_at(40),
            states,
        })
    }

    /// The label of a copy from its two slots (the first
    /// [`LABEL_BYTES`] of the copy): the valid one with the higher
    /// generation.
    pub fn newest(area: &[u8]) -> Option<Label> {
        let a = Label::decode(area.get(..SLOT_BYTES)?);
        let b = Label::decode(area.get(SLOT_BYTES..2 * SLOT_BYTES)?);
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.generation > a.generation { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// True if `area` begins with a label slot (valid or not) of a
    /// mirrored copy: the magic is there. Opening uses it to tell a
    /// mirrored database's file from an unmirrored one's meta page.
    pub fn looks_like_label(area: &[u8]) -> bool {
        area.get(8..16) == Some(&MAGIC[..])
            || area.get(SLOT_BYTES + 8..SLOT_BYTES + 16) == Some(&MAGIC[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(generation: u64) -> Label {
        Label {
            set_id: 0xfeed,
            role: Role::Log(3),
            copy: 1,
            generation,
            states: vec![
                CopyState::Healthy,
                CopyState::Rebuilding { done: 1 << 30 },
                CopyState::Failed,
            ],
        }
    }

    #[test]
    fn a_label_round_trips_and_damage_is_never_a_label() {
        let l = label(7);
        let b = l.encode();
        assert_eq!(Label::decode(&b), Some(l.clone()));
        for at in [0, 5, 9, 17, 30, 41, 48, 60, 4095] {
            let mut d = b;
            d[at] ^= 0x10;
            assert_eq!(Label::decode(&d), None, "flip at {at}");
        }
        assert_eq!(Label::decode(&[0u8; SLOT_BYTES]), None);
        assert!(Label::looks_like_label(&b));
        assert!(!Label::looks_like_label(&[0u8; SLOT_BYTES]));
    }

    #[test]
    fn the_newer_valid_slot_wins_and_a_torn_one_leaves_the_older() {
        let mut area = vec![0u8; LABEL_BYTES as usize];
        let (old, new) = (label(4), label(5));
        assert_eq!((old.slot(), new.slot()), (0, 1));
        area[..SLOT_BYTES].copy_from_slice(&old.encode());
        area[SLOT_BYTES..].copy_from_slice(&new.encode());
        assert_eq!(Label::newest(&area).unwrap().generation, 5);
        // The write of generation 5 torn: generation 4 stays.
        area[SLOT_BYTES + 100] ^= 1;
        assert_eq!(Label::newest(&area).unwrap().generation, 4);
        assert_eq!(Label::newest(&[0u8; LABEL_BYTES as usize]), None);
    }
}
