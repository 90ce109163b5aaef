//! WiredTiger 3.2.1 transactions through its C API, behind [`TxPeer`]
//! (the TPC-C peer). Uses the structs of the parent binding.
//!
//! Configuration: `wiredtiger_open(dir, NULL, "create,cache_size=<budget>,
//! session_max=1024,log=(enabled=true,archive=true),
//! checkpoint=(wait=60),direct_io=[data],eviction=(threads_min=1,
//! threads_max=4)")` (no `direct_io` when direct I/O is off): the cache
//! holds clean and dirty pages within the budget, the write-ahead log is
//! on, a checkpoint runs every 60 s (MongoDB's default). One table
//! `table:tpcc` with `key_format=u,value_format=u`, 4 KiB allocation and
//! page sizes, no compression. Transactions: `begin_transaction(
//! "isolation=snapshot")`; a durable commit is
//! `commit_transaction("sync=on")` (the log is synced; WiredTiger
//! consolidates concurrent commits into one write and sync), a
//! non-durable one `"sync=off"`. A write-write conflict comes back as
//! `WT_ROLLBACK`: that, and only that, is [`PeerTxError::Conflict`].
//!
//! Sessions are single-threaded: a transaction borrows a session with an
//! open cursor from the per-thread pool and gives it back, reset, when it
//! ends.

use std::ffi::c_int;
use std::ops::Bound;
use std::path::PathBuf;
use std::ptr;
use std::sync::Arc;

use super::txn::{
    fresh_dir, scan_step, Entries, PeerTx, PeerTxError, PeerTxResult, ScanStep, TxPeer,
};
use super::wiredtiger::{
    check, connect, open_handle, open_session, wt, wt_set, Handle, WtConnection, WtCursor, WtItem,
    WT_NOTFOUND, WT_ROLLBACK,
};
use super::{PeerConfig, Pool};
use crate::{CliError, CliResult};

/// Sessions the connection allows: one per client thread (the sweep
/// reaches 128 and pooled sessions outlive their threads) plus the
/// loader's and the checker's, with room to spare.
const SESSIONS: usize = 1024;

/// The table of the TPC-C load.
const URI: &std::ffi::CStr = c"table:tpcc";

/// A WiredTiger return code as a transaction result.
fn outcome(rc: c_int, what: &str) -> PeerTxResult<()> {
    match rc {
        0 => Ok(()),
        WT_ROLLBACK => Err(PeerTxError::Conflict(format!(
            "wiredtiger: {what}: conflict (WT_ROLLBACK)"
        ))),
        rc => Err(PeerTxError::Failed(
            check(rc, what).err().unwrap_or(CliError(what.into())),
        )),
    }
}

/// WiredTiger with transactions behind [`TxPeer`].
pub struct WtTxDb {
    conn: *mut WtConnection,
    handles: Pool<Handle>,
    cache_bytes: usize,
    direct_io: bool,
}

// SAFETY: WT_CONNECTION is thread-safe; sessions are used by one thread at
// a time (the pool hands each to one transaction).
unsafe impl Send for WtTxDb {}
// SAFETY: as for Send.
unsafe impl Sync for WtTxDb {}

impl WtTxDb {
    /// Creates a fresh database under `cfg.dir/wiredtiger/` (wiping any).
    pub fn open(cfg: &PeerConfig) -> CliResult<Self> {
        let dir = fresh_dir(cfg, "wiredtiger")?;
        Self::open_dir(cfg, dir)
    }

    /// Opens the database under `cfg.dir/wiredtiger/` as it is.
    #[cfg(test)]
    pub fn reopen(cfg: &PeerConfig) -> CliResult<Self> {
        Self::open_dir(cfg, cfg.dir.join("wiredtiger"))
    }

    fn open_dir(cfg: &PeerConfig, dir: PathBuf) -> CliResult<Self> {
        let cache_bytes = cfg.cache_bytes.max(1 << 20);
        let config = format!(
            "create,cache_size={cache_bytes},session_max={SESSIONS},\
             log=(enabled=true,archive=true),checkpoint=(wait=60),\
             eviction=(threads_min=1,threads_max=4){}",
            if cfg.direct_io {
                ",direct_io=[data]"
            } else {
                ""
            },
        );
        let conn = connect(&dir, &config, URI)?;
        // From here on Drop closes the connection.
        let me = WtTxDb {
            conn,
            handles: Pool::new(),
            cache_bytes,
            direct_io: cfg.direct_io,
        };
        Ok(me)
    }

    /// A pooled session and cursor, or a new one.
    fn handle(&self) -> CliResult<Handle> {
        match self.handles.take() {
            Some(h) => Ok(h),
            // SAFETY: the connection is open until Drop.
            None => unsafe { open_handle(self.conn, URI) },
        }
    }
}

impl Drop for WtTxDb {
    fn drop(&mut self) {
        for h in self.handles.drain() {
            // SAFETY: pooled sessions are idle (no transaction is alive:
            // each holds an Arc of this); closing one closes its cursor.
            unsafe { wt!(h.session, close, ptr::null()) };
        }
        // SAFETY: no call is in flight (`&mut self`); closing the
        // connection checkpoints and frees it.
        unsafe { wt!(self.conn, close, ptr::null()) };
    }
}

impl TxPeer for WtTxDb {
    fn name(&self) -> &'static str {
        "wiredtiger"
    }

    fn isolation(&self) -> &'static str {
        "snapshot"
    }

    fn config(&self) -> String {
        format!(
            "cache {} MiB (clean and dirty pages), log on, checkpoint every 60 s, \
             4 KiB pages, no compression, direct I/O {}",
            self.cache_bytes >> 20,
            if self.direct_io { "on (data)" } else { "off" }
        )
    }

    fn begin(self: Arc<Self>, sync: bool, _read_only: bool) -> PeerTxResult<Box<dyn PeerTx>> {
        let h = self.handle()?;
        // SAFETY: the session is this transaction's alone.
        let rc = unsafe { wt!(h.session, begin_transaction, c"isolation=snapshot".as_ptr()) };
        let tx = WtTx {
            h: Some(h),
            open: rc == 0,
            sync,
            db: self,
        };
        outcome(rc, "begin_transaction")?;
        Ok(Box::new(tx))
    }

    fn settle(&self) -> CliResult<()> {
        // SAFETY: the connection is open until Drop.
        let session = unsafe { open_session(self.conn)? };
        // SAFETY: the session is live, ours, and closed once after.
        let rc = unsafe {
            let rc = wt!(session, checkpoint, ptr::null());
            wt!(session, close, ptr::null());
            rc
        };
        check(rc, "checkpoint")
    }
}

/// One WiredTiger transaction on a borrowed session.
struct WtTx {
    /// Some until the transaction ends.
    h: Option<Handle>,
    /// True while a transaction is open on the session.
    open: bool,
    sync: bool,
    /// Keeps the connection open (dropped after the handle is returned).
    db: Arc<WtTxDb>,
}

impl WtTx {
    fn cursor(&self) -> *mut WtCursor {
        self.h.as_ref().map_or(ptr::null_mut(), |h| h.cursor)
    }

    /// The key and value under the positioned cursor, copied.
    ///
    /// # Safety
    /// The cursor must be positioned on a record.
    unsafe fn current(c: *mut WtCursor) -> PeerTxResult<(Vec<u8>, Vec<u8>)> {
        let (mut k, mut v) = (WtItem::empty(), WtItem::empty());
        outcome(wt!(c, get_key, &mut k as *mut WtItem), "get_key")?;
        outcome(wt!(c, get_value, &mut v as *mut WtItem), "get_value")?;
        // The items point into the cursor's page, valid until it moves.
        Ok((
            std::slice::from_raw_parts(k.data.cast::<u8>(), k.size).to_vec(),
            std::slice::from_raw_parts(v.data.cast::<u8>(), v.size).to_vec(),
        ))
    }
}

impl PeerTx for WtTx {
    fn get(&mut self, key: &[u8], _for_update: bool) -> PeerTxResult<Option<Vec<u8>>> {
        let c = self.cursor();
        let k = WtItem::of(key);
        // SAFETY: the cursor is this transaction's; `k` outlives the search.
        let rc = unsafe {
            wt_set!(c, set_key, &k);
            wt!(c, search)
        };
        if rc == WT_NOTFOUND {
            return Ok(None);
        }
        outcome(rc, "search")?;
        let mut v = WtItem::empty();
        // SAFETY: the cursor is positioned; "u" fills a WT_ITEM whose data
        // stays valid until the cursor moves (after the copy).
        unsafe {
            outcome(wt!(c, get_value, &mut v as *mut WtItem), "get_value")?;
            Ok(Some(
                std::slice::from_raw_parts(v.data.cast::<u8>(), v.size).to_vec(),
            ))
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> PeerTxResult<()> {
        let c = self.cursor();
        let (k, v) = (WtItem::of(key), WtItem::of(value));
        // SAFETY: the cursor is this transaction's; the items outlive the
        // insert, which copies them (overwrite=true: an upsert).
        let rc = unsafe {
            wt_set!(c, set_key, &k);
            wt_set!(c, set_value, &v);
            wt!(c, insert)
        };
        outcome(rc, "insert")
    }

    fn delete(&mut self, key: &[u8]) -> PeerTxResult<()> {
        let c = self.cursor();
        let k = WtItem::of(key);
        // SAFETY: as for put.
        let rc = unsafe {
            wt_set!(c, set_key, &k);
            wt!(c, remove)
        };
        match rc {
            WT_NOTFOUND => Ok(()),
            rc => outcome(rc, "remove"),
        }
    }

    fn scan(
        &mut self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> PeerTxResult<Entries> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let c = self.cursor();
        let near = if forward { lo } else { hi };
        // SAFETY: the cursor is this transaction's; items outlive the
        // calls that read them; keys and values are copied before the
        // cursor moves.
        unsafe {
            let mut rc = match near {
                Bound::Included(b) | Bound::Excluded(b) => {
                    let k = WtItem::of(b);
                    let mut exact: c_int = 0;
                    wt_set!(c, set_key, &k);
                    let rc = wt!(c, search_near, &mut exact);
                    // search_near lands on either side of the key: step
                    // to the side the scan starts on.
                    match (rc, forward) {
                        (0, true) if exact < 0 => wt!(c, next),
                        (0, false) if exact > 0 => wt!(c, prev),
                        _ => rc,
                    }
                }
                Bound::Unbounded => {
                    outcome(wt!(c, reset), "reset")?;
                    if forward {
                        wt!(c, next)
                    } else {
                        wt!(c, prev)
                    }
                }
            };
            while rc == 0 && out.len() < limit {
                let (k, v) = Self::current(c)?;
                match scan_step(&k, lo, hi, forward) {
                    ScanStep::Stop => break,
                    ScanStep::Skip => {}
                    ScanStep::Take => out.push((k, v)),
                }
                rc = if forward { wt!(c, next) } else { wt!(c, prev) };
            }
            if rc != WT_NOTFOUND {
                outcome(rc, "scan")?;
            }
        }
        Ok(out)
    }

    fn commit(mut self: Box<Self>) -> PeerTxResult<()> {
        let Some(h) = self.h.as_ref() else {
            return Err(PeerTxError::Failed(CliError(
                "wiredtiger: commit of an ended transaction".into(),
            )));
        };
        let config = if self.sync { c"sync=on" } else { c"sync=off" };
        // SAFETY: the session is this transaction's; a commit ends the
        // transaction whatever it returns (a failed one rolls back).
        let rc = unsafe { wt!(h.session, commit_transaction, config.as_ptr()) };
        self.open = false;
        outcome(rc, "commit_transaction")
    }
}

impl Drop for WtTx {
    fn drop(&mut self) {
        let Some(h) = self.h.take() else { return };
        // SAFETY: the session is this transaction's; a rollback ends an
        // open transaction; the reset cursor pins nothing once pooled.
        unsafe {
            if self.open {
                wt!(h.session, rollback_transaction, ptr::null());
            }
            wt!(h.cursor, reset);
        }
        self.db.handles.give(h);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn peers_wiredtiger_transactions_conform() {
        super::super::txn::tests::conformance("wiredtiger", true);
    }
}
