//! The study's files: data devices filled with real bytes before anything
//! reads them, the WAL file, and dropping the OS page cache.
//!
//! A preallocated but never written extent reads back as zeros without any
//! device I/O, which would fake read figures; so every data device is
//! written once, sequentially in 4 MiB O_DIRECT writes of non-zero bytes,
//! and a marker file in the study directory remembers the filled size so
//! that reruns reuse it. Block devices named with `--device` are
//! overwritten the same way (only the first `--data-gib`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dana::io::array::open_queue;
use dana::io::device::DeviceOptions;
use dana::io::{AlignedBuf, Backend, Device, IoBuf, Request, Target};

use crate::rng::XorShift;
use crate::{CliError, CliResult, Context};

/// Bytes per fill write.
const FILL_CHUNK: usize = 4 << 20;

/// The data devices and WAL file of a study.
#[derive(Debug, Clone)]
pub struct DataSet {
    /// Data devices, in array order.
    pub devices: Vec<PathBuf>,
    /// Bytes written (readable) at the start of each data device.
    pub filled_bytes: u64,
    /// The WAL file.
    pub wal: PathBuf,
    /// WAL size in bytes; WAL writes wrap around.
    pub wal_bytes: u64,
}

/// The marker content for a device filled up to `bytes`.
fn marker_text(bytes: u64) -> String {
    format!("dana iostudy fill v1\nbytes={bytes}\n")
}

/// The filled size a marker records, if it is one of ours.
pub fn parse_marker(text: &str) -> Option<u64> {
    let mut lines = text.lines();
    if lines.next()? != "dana iostudy fill v1" {
        return None;
    }
    lines.find_map(|l| l.strip_prefix("bytes=")?.trim().parse().ok())
}

fn marker_path(dir: &Path, device: &Path) -> PathBuf {
    let abs = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
    let name: String = abs
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    dir.join(format!("filled{name}.marker"))
}

/// Creates (if needed) and fills `devices` up to `bytes` each, unless a
/// marker says it was done. Returns the filled size per device (smaller
/// than `bytes` for a smaller block device). `say` reports progress.
pub fn prepare(
    dir: &Path,
    devices: &[PathBuf],
    bytes: u64,
    wal: PathBuf,
    wal_bytes: u64,
    say: &dyn Fn(&str),
) -> CliResult<DataSet> {
    std::fs::create_dir_all(dir).context(format!("creating {}", dir.display()))?;
    let mut filled = u64::MAX;
    for (i, path) in devices.iter().enumerate() {
        let is_block = std::fs::metadata(path)
            .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
            .unwrap_or(false);
        let opts = DeviceOptions {
            direct: true,
            create_size: (!is_block).then_some(bytes),
            read_only: false,
            lock: false,
        };
        let dev = Arc::new(Device::open(path, i, opts)?);
        let want = bytes.min(dev.size()) / FILL_CHUNK as u64 * FILL_CHUNK as u64;
        if want == 0 {
            return Err(CliError(format!(
                "{} holds {} bytes; the study needs at least {FILL_CHUNK}",
                path.display(),
                dev.size()
            )));
        }
        let marker = marker_path(dir, path);
        let done = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|t| parse_marker(&t))
            .unwrap_or(0);
        if done < want {
            say(&format!(
                "filling {} with {} MiB of data (once; remembered in {})",
                path.display(),
                want >> 20,
                marker.display()
            ));
            fill(&dev, want, i as u64)?;
            std::fs::write(&marker, marker_text(want))
                .context(format!("writing {}", marker.display()))?;
        }
        filled = filled.min(want);
    }
    Ok(DataSet {
        devices: devices.to_vec(),
        filled_bytes: filled,
        wal,
        wal_bytes,
    })
}

/// Writes `bytes` of non-zero data at the start of `dev`, sequentially,
/// then makes it durable.
fn fill(dev: &Arc<Device>, bytes: u64, seed: u64) -> CliResult<()> {
    let mut q = open_queue(&Target::File(dev.clone()), &Backend::Blocking, 1)?;
    let mut buf = AlignedBuf::new(FILL_CHUNK, 4096)?;
    let mut rng = XorShift::new(seed ^ 0xDA7A);
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < bytes {
        for word in buf.chunks_exact_mut(8) {
            word.copy_from_slice(&(rng.next_u64() | 1).to_le_bytes());
        }
        let req = Request::write(0, offset, IoBuf::owned(buf));
        q.push(req).map_err(|r| CliError(r.error.to_string()))?;
        q.submit()?;
        out.clear();
        q.reap(&mut out);
        let c = out
            .pop()
            .ok_or_else(|| CliError("fill write did not complete".into()))?;
        c.result
            .context(format!("filling {}", dev.path().display()))?;
        buf = c
            .buf
            .and_then(|b| b.into_owned())
            .ok_or_else(|| CliError("fill buffer not handed back".into()))?;
        offset += FILL_CHUNK as u64;
    }
    dev.sync()?;
    Ok(())
}

/// Drops clean pages from the OS page cache (`echo 1 >
/// /proc/sys/vm/drop_caches`, needs root). Returns why not, on failure.
pub fn drop_page_cache() -> Result<(), String> {
    std::fs::write("/proc/sys/vm/drop_caches", "1\n").map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trip() {
        assert_eq!(parse_marker(&marker_text(1 << 30)), Some(1 << 30));
        assert_eq!(parse_marker("something else\nbytes=5\n"), None);
        assert_eq!(parse_marker(""), None);
    }

    #[test]
    fn fill_writes_non_zero_bytes_and_is_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("data-0");
        let say = |_: &str| {};
        let ds = prepare(
            dir.path(),
            std::slice::from_ref(&dev),
            8 << 20,
            dir.path().join("wal"),
            1 << 20,
            &say,
        )
        .unwrap();
        assert_eq!(ds.filled_bytes, 8 << 20);
        let bytes = std::fs::read(&dev).unwrap();
        assert!(bytes[..8 << 20]
            .chunks(4096)
            .all(|p| p.iter().any(|&b| b != 0)));
        let marker = std::fs::read_to_string(marker_path(dir.path(), &dev)).unwrap();
        assert_eq!(parse_marker(&marker), Some(8 << 20));
    }
}
