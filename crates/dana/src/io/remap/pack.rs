//! A page compressed into an extent of whole units, and back (#14 item 3).
//!
//! Owns: the byte format of a compressed extent: a 4-byte little-endian
//! length, then an LZ4 block of the page (`lz4_flex`, a pure-Rust LZ4),
//! then zeros up to the unit. A page that would not shrink by at least
//! one unit is stored as it is, in a page-sized extent; the extent's size
//! tells the two apart.
//!
//! Never: hands back a page of the wrong length (an extent whose length
//! field or LZ4 structure is damaged is an error), or panics on any bytes
//! read from a device. An LZ4 block carries no checksum: a flipped
//! literal, or a match offset that still lands inside the page, rebuilds
//! a page of the right length with wrong bytes, which this module cannot
//! tell. The engine's page check (crc32c and page id,
//! `buffer::page::verify`, on every read into the pool) rejects it; a
//! reader that bypassed that check would get the wrong page (a review's
//! point).

/// Bytes of a compressed extent's length field.
const LEN_BYTES: usize = 4;

/// Fills `out` with the extent that stores `page` (compressed, or the
/// page itself when that saves no unit) and returns its length in bytes,
/// not yet padded: the extent takes `len.div_ceil(unit)` units.
pub(crate) fn compress_page(page: &[u8], unit: usize, out: &mut Vec<u8>) -> usize {
    out.clear();
    out.resize(
        LEN_BYTES + lz4_flex::block::get_maximum_output_size(page.len()),
        0,
    );
    let packed = lz4_flex::block::compress_into(page, &mut out[LEN_BYTES..])
        .ok()
        .filter(|&n| (LEN_BYTES + n).div_ceil(unit) < page.len() / unit);
    match packed {
        Some(n) => {
            out[..LEN_BYTES].copy_from_slice(&(n as u32).to_le_bytes());
            out.truncate(LEN_BYTES + n);
        }
        None => {
            out.clear();
            out.extend_from_slice(page);
        }
    }
    out.len()
}

/// Rebuilds into `page` the page a compressed extent holds (an extent
/// smaller than a page; the whole extent as read, padding included).
pub(crate) fn decompress_page(extent: &[u8], page: &mut [u8]) -> Result<(), String> {
    let Some(head) = extent.get(..LEN_BYTES) else {
        return Err(format!("a compressed extent of {} bytes", extent.len()));
    };
    let n = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
    let Some(block) = extent.get(LEN_BYTES..LEN_BYTES.saturating_add(n)) else {
        return Err(format!(
            "a compressed extent of {} bytes says it holds {n}",
            extent.len()
        ));
    };
    match lz4_flex::block::decompress_into(block, page) {
        Ok(got) if got == page.len() => Ok(()),
        Ok(got) => Err(format!(
            "a compressed extent rebuilt {got} bytes of a {}-byte page",
            page.len()
        )),
        Err(e) => Err(format!("a compressed extent does not decompress: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_compressible_page_shrinks_and_comes_back() {
        let mut page = vec![0u8; 4096];
        for (i, b) in page.iter_mut().enumerate() {
            *b = (i % 61) as u8;
        }
        let mut out = Vec::new();
        let len = compress_page(&page, 512, &mut out);
        assert!(len < 1024, "{len}");
        out.resize(len.div_ceil(512) * 512, 0);
        let mut back = vec![0xEEu8; 4096];
        decompress_page(&out, &mut back).unwrap();
        assert_eq!(back, page);
    }

    #[test]
    fn an_incompressible_page_is_stored_whole() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let page: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut out = Vec::new();
        assert_eq!(compress_page(&page, 512, &mut out), 4096);
        assert_eq!(out, page);
    }

    #[test]
    fn damaged_extents_are_errors() {
        let page = vec![7u8; 4096];
        let mut out = Vec::new();
        let len = compress_page(&page, 512, &mut out);
        let mut back = vec![0u8; 4096];
        assert!(decompress_page(&out[..2], &mut back).is_err());
        let mut long = out[..len].to_vec();
        long[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decompress_page(&long, &mut back).is_err());
        let mut short = out[..len].to_vec();
        short[..4].copy_from_slice(&((len - 5) as u32).to_le_bytes());
        assert!(decompress_page(&short, &mut back).is_err());
    }

    proptest! {
        /// Any page, compressible or not, comes back byte for byte, and
        /// any bytes given as an extent give a page or an error (never a
        /// panic).
        #[test]
        fn pages_round_trip(seed in any::<u64>(), runs in 1usize..64, junk in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut x = seed | 1;
            let mut page = vec![0u8; 4096];
            let mut i = 0;
            while i < page.len() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let run = (x as usize % runs + 1).min(page.len() - i);
                page[i..i + run].fill((x >> 32) as u8);
                i += run;
            }
            let mut out = Vec::new();
            let len = compress_page(&page, 512, &mut out);
            if len < page.len() {
                out.resize(len.div_ceil(512) * 512, 0);
                let mut back = vec![0u8; 4096];
                decompress_page(&out, &mut back).unwrap();
                prop_assert_eq!(back, page);
            } else {
                prop_assert_eq!(&out, &page);
            }
            let mut back = vec![0u8; 4096];
            let _ = decompress_page(&junk, &mut back);
        }
    }
}
