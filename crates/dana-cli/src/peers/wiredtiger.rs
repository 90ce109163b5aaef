//! WiredTiger 3.2.1 through its C API (`wiredtiger.h`), linked against the
//! system `libwiredtiger`.
//!
//! The API is structs of function pointers; the `#[repr(C)]` structs
//! below copy `WT_CONNECTION`, `WT_SESSION` and `WT_CURSOR` from the
//! 3.2.1 header field for field up to the last method called (checked
//! against `gcc -E` output of the installed header; `SWIG` and `DOXYGEN`
//! undefined, so `app_private`, `debug_info`, `import` are present).
//!
//! Configuration: `wiredtiger_open(dir, NULL, "create,cache_size=<cache_bytes>,
//! session_max=1024,direct_io=[data],eviction=(threads_min=1,threads_max=<threads,
//! 1..=20>)")` (no `direct_io` when direct I/O is off); one table
//! `table:dana` with `key_format=u,value_format=u,allocation_size=4KB,
//! internal_page_max=4KB,leaf_page_max=4KB,block_compressor=` (no
//! compression). By [`PeerConfig::durability`]: `Off`, no log (the
//! default): updates are durable at checkpoints; `Async`,
//! `log=(enabled=true,archive=true),checkpoint=(wait=60),
//! transaction_sync=(enabled=false)`: logged, not synced per commit;
//! `Sync`, the same with `transaction_sync=(enabled=true,method=fsync)`,
//! so each auto-committed write returns after its log record is synced
//! (concurrent commits share a flush). Load: one `bulk` cursor
//! in key order, then a checkpoint. Reads and writes: WiredTiger sessions
//! are single-threaded, so each call borrows a session with an open
//! cursor (default `overwrite=true`, so insert is an upsert) from a
//! per-thread pool, and resets the cursor before giving it back so it
//! pins no page or snapshot between calls.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr;

use super::{
    already_loaded, engine_dir, write_marker, LoadKeys, PeerConfig, PeerEngine, Pool, LOAD_BATCH,
};
use crate::{CliError, CliResult};

pub(super) const WT_ROLLBACK: c_int = -31800;
pub(super) const WT_NOTFOUND: c_int = -31803;
/// Returned by [`wt!`] when a method pointer is null (never, in 3.2.1).
pub(super) const NO_METHOD: c_int = libc::ENOTSUP;

/// `WT_ITEM`.
#[repr(C)]
pub(super) struct WtItem {
    pub(super) data: *const c_void,
    pub(super) size: usize,
    pub(super) mem: *mut c_void,
    pub(super) memsize: usize,
    pub(super) flags: u32,
}

impl WtItem {
    pub(super) fn of(b: &[u8]) -> Self {
        WtItem {
            data: b.as_ptr().cast(),
            size: b.len(),
            mem: ptr::null_mut(),
            memsize: 0,
            flags: 0,
        }
    }
    pub(super) fn empty() -> Self {
        Self::of(&[])
    }
}

type CursorFn = unsafe extern "C" fn(*mut WtCursor) -> c_int;
type CursorVarFn = unsafe extern "C" fn(*mut WtCursor, ...) -> c_int;
type CursorSetFn = unsafe extern "C" fn(*mut WtCursor, ...);
type CursorCmpFn = unsafe extern "C" fn(*mut WtCursor, *mut WtCursor, *mut c_int) -> c_int;
type SessionFn = unsafe extern "C" fn(*mut WtSession) -> c_int;
type SessionCfgFn = unsafe extern "C" fn(*mut WtSession, *const c_char) -> c_int;
type SessionNameFn = unsafe extern "C" fn(*mut WtSession, *const c_char, *const c_char) -> c_int;
type ConnFn = unsafe extern "C" fn(*mut WtConnection) -> c_int;
type ConnCfgFn = unsafe extern "C" fn(*mut WtConnection, *const c_char) -> c_int;

/// `WT_CURSOR`, up to `close`.
#[repr(C)]
pub(super) struct WtCursor {
    pub(super) session: *mut WtSession,
    pub(super) uri: *const c_char,
    pub(super) key_format: *const c_char,
    pub(super) value_format: *const c_char,
    pub(super) get_key: Option<CursorVarFn>,
    pub(super) get_value: Option<CursorVarFn>,
    pub(super) set_key: Option<CursorSetFn>,
    pub(super) set_value: Option<CursorSetFn>,
    pub(super) compare: Option<CursorCmpFn>,
    pub(super) equals: Option<CursorCmpFn>,
    pub(super) next: Option<CursorFn>,
    pub(super) prev: Option<CursorFn>,
    pub(super) reset: Option<CursorFn>,
    pub(super) search: Option<CursorFn>,
    pub(super) search_near: Option<unsafe extern "C" fn(*mut WtCursor, *mut c_int) -> c_int>,
    pub(super) insert: Option<CursorFn>,
    pub(super) modify: Option<unsafe extern "C" fn(*mut WtCursor, *mut c_void, c_int) -> c_int>,
    pub(super) update: Option<CursorFn>,
    pub(super) remove: Option<CursorFn>,
    pub(super) reserve: Option<CursorFn>,
    pub(super) close: Option<CursorFn>,
}

/// `WT_SESSION`, up to `checkpoint`.
#[repr(C)]
pub(super) struct WtSession {
    pub(super) connection: *mut WtConnection,
    pub(super) app_private: *mut c_void,
    pub(super) close: Option<SessionCfgFn>,
    pub(super) reconfigure: Option<SessionCfgFn>,
    pub(super) strerror: Option<unsafe extern "C" fn(*mut WtSession, c_int) -> *const c_char>,
    pub(super) open_cursor: Option<
        unsafe extern "C" fn(
            *mut WtSession,
            *const c_char,
            *mut WtCursor,
            *const c_char,
            *mut *mut WtCursor,
        ) -> c_int,
    >,
    pub(super) alter: Option<SessionNameFn>,
    pub(super) create: Option<SessionNameFn>,
    pub(super) import: Option<SessionNameFn>,
    pub(super) compact: Option<SessionNameFn>,
    pub(super) drop: Option<SessionNameFn>,
    pub(super) join: Option<
        unsafe extern "C" fn(*mut WtSession, *mut WtCursor, *mut WtCursor, *const c_char) -> c_int,
    >,
    pub(super) log_flush: Option<SessionCfgFn>,
    pub(super) log_printf:
        Option<unsafe extern "C" fn(*mut WtSession, *const c_char, ...) -> c_int>,
    pub(super) rebalance: Option<SessionNameFn>,
    pub(super) rename: Option<
        unsafe extern "C" fn(*mut WtSession, *const c_char, *const c_char, *const c_char) -> c_int,
    >,
    pub(super) reset: Option<SessionFn>,
    pub(super) salvage: Option<SessionNameFn>,
    pub(super) truncate: Option<
        unsafe extern "C" fn(
            *mut WtSession,
            *const c_char,
            *mut WtCursor,
            *mut WtCursor,
            *const c_char,
        ) -> c_int,
    >,
    pub(super) upgrade: Option<SessionNameFn>,
    pub(super) verify: Option<SessionNameFn>,
    pub(super) begin_transaction: Option<SessionCfgFn>,
    pub(super) commit_transaction: Option<SessionCfgFn>,
    pub(super) prepare_transaction: Option<SessionCfgFn>,
    pub(super) rollback_transaction: Option<SessionCfgFn>,
    pub(super) timestamp_transaction: Option<SessionCfgFn>,
    pub(super) query_timestamp:
        Option<unsafe extern "C" fn(*mut WtSession, *mut c_char, *const c_char) -> c_int>,
    pub(super) checkpoint: Option<SessionCfgFn>,
}

/// `WT_CONNECTION`, up to `open_session`.
#[repr(C)]
pub(super) struct WtConnection {
    pub(super) async_flush: Option<ConnFn>,
    pub(super) async_new_op: Option<
        unsafe extern "C" fn(
            *mut WtConnection,
            *const c_char,
            *const c_char,
            *mut c_void,
            *mut *mut c_void,
        ) -> c_int,
    >,
    pub(super) close: Option<ConnCfgFn>,
    pub(super) debug_info: Option<ConnCfgFn>,
    pub(super) reconfigure: Option<ConnCfgFn>,
    pub(super) get_home: Option<unsafe extern "C" fn(*mut WtConnection) -> *const c_char>,
    pub(super) configure_method: Option<
        unsafe extern "C" fn(
            *mut WtConnection,
            *const c_char,
            *const c_char,
            *const c_char,
            *const c_char,
            *const c_char,
        ) -> c_int,
    >,
    pub(super) is_new: Option<ConnFn>,
    pub(super) open_session: Option<
        unsafe extern "C" fn(
            *mut WtConnection,
            *mut c_void,
            *const c_char,
            *mut *mut WtSession,
        ) -> c_int,
    >,
}

#[link(name = "wiredtiger")]
extern "C" {
    pub(super) fn wiredtiger_open(
        home: *const c_char,
        event_handler: *mut c_void,
        config: *const c_char,
        conn: *mut *mut WtConnection,
    ) -> c_int;
    fn wiredtiger_strerror(err: c_int) -> *const c_char;
}

/// Calls method `$m` of handle `$h` (a raw pointer) with the handle as
/// the first argument; [`NO_METHOD`] if the pointer is null. Must be used
/// inside `unsafe`.
macro_rules! wt {
    ($h:expr, $m:ident $(, $arg:expr)*) => {{
        let h = $h;
        match (*h).$m {
            Some(f) => f(h $(, $arg)*),
            None => $crate::peers::wiredtiger::NO_METHOD,
        }
    }};
}

/// Sets a cursor's key or value (`set_key`/`set_value`, which return
/// nothing: an error shows up in the next call). Must be used inside
/// `unsafe`.
macro_rules! wt_set {
    ($c:expr, $m:ident, $item:expr) => {{
        let c = $c;
        if let Some(f) = (*c).$m {
            f(c, $item as *const WtItem);
        }
    }};
}

pub(super) use {wt, wt_set};

/// A WiredTiger return code as a result.
pub(super) fn check(rc: c_int, what: impl std::fmt::Display) -> CliResult<()> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: wiredtiger_strerror returns a NUL-terminated string for any
    // code (static, or strerror's).
    let msg = unsafe { CStr::from_ptr(wiredtiger_strerror(rc)) }
        .to_string_lossy()
        .into_owned();
    Err(CliError(format!("wiredtiger: {what}: {msg} ({rc})")))
}

/// Opens the connection in `dir` with `config` and creates table `uri`
/// (raw byte keys and values, 4 KiB allocation and page sizes, no
/// compression) unless it exists. The caller closes the connection.
pub(super) fn connect(
    dir: &std::path::Path,
    config: &str,
    uri: &CStr,
) -> CliResult<*mut WtConnection> {
    let home = super::c_path(dir)?;
    let config = CString::new(config)
        .map_err(|_| CliError(format!("wiredtiger config {config:?} contains NUL")))?;
    let mut conn = ptr::null_mut();
    // SAFETY: home and config are NUL-terminated and outlive the call;
    // `conn` is an out-pointer.
    let rc = unsafe { wiredtiger_open(home.as_ptr(), ptr::null_mut(), config.as_ptr(), &mut conn) };
    check(rc, format_args!("opening {}", dir.display()))?;
    let table = c"key_format=u,value_format=u,allocation_size=4KB,internal_page_max=4KB,\
                  leaf_page_max=4KB,block_compressor=";
    // SAFETY: the connection was just opened.
    let created = unsafe { open_session(conn) }.and_then(|session| {
        // SAFETY: the session is live; strings are NUL-terminated; the
        // session is closed once.
        let rc = unsafe {
            let rc = wt!(session, create, uri.as_ptr(), table.as_ptr());
            wt!(session, close, ptr::null());
            rc
        };
        check(rc, format_args!("creating {}", uri.to_string_lossy()))
    });
    if let Err(e) = created {
        // SAFETY: the connection is open, unused by anyone else, closed once.
        unsafe { wt!(conn, close, ptr::null()) };
        return Err(e);
    }
    Ok(conn)
}

/// A new session of `conn`.
///
/// # Safety
/// `conn` must be an open connection.
pub(super) unsafe fn open_session(conn: *mut WtConnection) -> CliResult<*mut WtSession> {
    let mut session = ptr::null_mut();
    // SAFETY: the caller keeps the connection open; `session` is an
    // out-pointer.
    let rc = unsafe {
        wt!(
            conn,
            open_session,
            ptr::null_mut(),
            ptr::null(),
            &mut session
        )
    };
    check(rc, "opening a session")?;
    Ok(session)
}

/// A new session of `conn` with a cursor on `uri` (default
/// `overwrite=true`: insert is an upsert).
///
/// # Safety
/// `conn` must be an open connection.
pub(super) unsafe fn open_handle(conn: *mut WtConnection, uri: &CStr) -> CliResult<Handle> {
    // SAFETY: the caller keeps the connection open.
    let session = unsafe { open_session(conn)? };
    let mut cursor = ptr::null_mut();
    // SAFETY: the session is live and ours; `cursor` is an out-pointer.
    let rc = unsafe {
        wt!(
            session,
            open_cursor,
            uri.as_ptr(),
            ptr::null_mut(),
            ptr::null(),
            &mut cursor
        )
    };
    if rc != 0 {
        // SAFETY: the session is live and closed once.
        unsafe { wt!(session, close, ptr::null()) };
        check(rc, "opening a cursor")?;
    }
    Ok(Handle { session, cursor })
}

/// The table every load uses.
const URI: &CStr = c"table:dana";

/// A session with an open cursor on a table, used by one thread at a
/// time.
pub(super) struct Handle {
    pub(super) session: *mut WtSession,
    pub(super) cursor: *mut WtCursor,
}

// SAFETY: a WiredTiger session may move between threads as long as only
// one uses it at a time, which the pool guarantees.
unsafe impl Send for Handle {}

/// WiredTiger behind [`PeerEngine`].
pub struct WiredTiger {
    conn: *mut WtConnection,
    handles: Pool<Handle>,
    dir: PathBuf,
    direct_io: bool,
}

// SAFETY: WT_CONNECTION is thread-safe (open_session may be called from
// any thread); sessions are used by one thread at a time via the pool.
unsafe impl Send for WiredTiger {}
// SAFETY: as for Send.
unsafe impl Sync for WiredTiger {}

/// A handle borrowed from the pool; its cursor is reset and the handle
/// returned on drop.
struct Borrowed<'a> {
    wt: &'a WiredTiger,
    h: Handle,
}

impl Borrowed<'_> {
    fn cursor(&self) -> *mut WtCursor {
        self.h.cursor
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        // SAFETY: the cursor is live and used by this thread only; reset
        // releases its position, page pin and snapshot.
        unsafe { wt!(self.h.cursor, reset) };
        self.wt.handles.give(Handle {
            session: self.h.session,
            cursor: self.h.cursor,
        });
    }
}

impl WiredTiger {
    /// Opens or creates the database under `cfg.dir/wiredtiger/`.
    pub fn open(cfg: &PeerConfig) -> CliResult<Self> {
        let dir = engine_dir(cfg, "wiredtiger")?;
        let config = format!(
            "create,cache_size={},session_max=1024{}{},eviction=(threads_min=1,threads_max={})",
            cfg.cache_bytes.max(1 << 20),
            if cfg.direct_io {
                ",direct_io=[data]"
            } else {
                ""
            },
            match cfg.durability {
                dana::Durability::Off => "",
                dana::Durability::Async => {
                    ",log=(enabled=true,archive=true),checkpoint=(wait=60),\
                     transaction_sync=(enabled=false)"
                }
                dana::Durability::Sync => {
                    ",log=(enabled=true,archive=true),checkpoint=(wait=60),\
                     transaction_sync=(enabled=true,method=fsync)"
                }
            },
            cfg.threads.clamp(1, 20),
        );
        let conn = connect(&dir, &config, URI)?;
        // From here on Drop closes the connection.
        let me = WiredTiger {
            conn,
            handles: Pool::new(),
            dir,
            direct_io: cfg.direct_io,
        };
        Ok(me)
    }

    /// A new session.
    fn session(&self) -> CliResult<*mut WtSession> {
        // SAFETY: the connection is open until Drop.
        unsafe { open_session(self.conn) }
    }

    /// A session and cursor for this thread: pooled, or new.
    fn borrow(&self) -> CliResult<Borrowed<'_>> {
        let h = match self.handles.take() {
            Some(h) => h,
            // SAFETY: the connection is open until Drop.
            None => unsafe { open_handle(self.conn, URI)? },
        };
        Ok(Borrowed { wt: self, h })
    }

    /// Closes every pooled session (and its cursor).
    fn close_pooled(&self) {
        for h in self.handles.drain() {
            // SAFETY: pooled sessions are idle; closing one closes its
            // cursor; neither is used again.
            unsafe { wt!(h.session, close, ptr::null()) };
        }
    }
}

impl Drop for WiredTiger {
    fn drop(&mut self) {
        self.close_pooled();
        // SAFETY: no call is in flight (`&mut self`); closing the
        // connection checkpoints and frees it; it is not used again.
        unsafe { wt!(self.conn, close, ptr::null()) };
    }
}

impl PeerEngine for WiredTiger {
    fn name(&self) -> &'static str {
        "wiredtiger"
    }

    fn load(
        &self,
        records: u64,
        value_size: usize,
        keys: LoadKeys<'_>,
        value: &(dyn Fn(u64, &mut [u8]) + Sync),
        progress: &(dyn Fn(u64) + Sync),
    ) -> CliResult<()> {
        if already_loaded(&self.dir, records, value_size, keys)? {
            progress(records);
            return Ok(());
        }
        // A bulk cursor needs the table to itself.
        self.close_pooled();
        let session = self.session()?;
        let result = (|| {
            let mut bulk = ptr::null_mut();
            // SAFETY: the session is live and ours; `bulk` is an out-pointer.
            let rc = unsafe {
                wt!(
                    session,
                    open_cursor,
                    URI.as_ptr(),
                    ptr::null_mut(),
                    c"bulk".as_ptr(),
                    &mut bulk
                )
            };
            check(rc, "opening a bulk cursor")?;
            let mut buf = vec![0u8; value_size];
            let mut rc = 0;
            for i in 0..records {
                let k = keys.number(i);
                value(k, &mut buf);
                let key = (keys.key)(k);
                let (k, v) = (WtItem::of(&key), WtItem::of(&buf));
                // SAFETY: the cursor is live; the items point at buffers
                // that live across the insert, which copies them.
                rc = unsafe {
                    wt_set!(bulk, set_key, &k);
                    wt_set!(bulk, set_value, &v);
                    wt!(bulk, insert)
                };
                if rc != 0 {
                    break;
                }
                if (i + 1) % LOAD_BATCH == 0 {
                    progress(i + 1);
                }
            }
            // SAFETY: the cursor is live and closed once (this finishes
            // the bulk load).
            let close_rc = unsafe { wt!(bulk, close) };
            check(rc, "bulk insert")?;
            check(close_rc, "closing the bulk cursor")?;
            // SAFETY: the session is live.
            check(
                unsafe { wt!(session, checkpoint, ptr::null()) },
                "checkpoint",
            )
        })();
        // SAFETY: the session is live and closed once.
        unsafe { wt!(session, close, ptr::null()) };
        result?;
        progress(records);
        write_marker(&self.dir, records, value_size, keys)
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> CliResult<bool> {
        let b = self.borrow()?;
        let c = b.cursor();
        let k = WtItem::of(key);
        // SAFETY: the cursor is this thread's; `k` points at `key`, which
        // outlives the search.
        let rc = unsafe {
            wt_set!(c, set_key, &k);
            wt!(c, search)
        };
        if rc == WT_NOTFOUND {
            return Ok(false);
        }
        check(rc, "search")?;
        let mut v = WtItem::empty();
        // SAFETY: the cursor is positioned; "u" format fills a WT_ITEM.
        check(
            unsafe { wt!(c, get_value, &mut v as *mut WtItem) },
            "get_value",
        )?;
        // SAFETY: the item points at `v.size` bytes valid until the cursor
        // moves or resets (when `b` drops, after the copy).
        let data = unsafe { std::slice::from_raw_parts(v.data.cast::<u8>(), v.size) };
        out.clear();
        out.extend_from_slice(data);
        Ok(true)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> CliResult<()> {
        let b = self.borrow()?;
        let c = b.cursor();
        let (k, v) = (WtItem::of(key), WtItem::of(value));
        let mut rc = 0;
        // An autocommit update can be rolled back by a concurrent writer
        // of the same key: retry.
        for _ in 0..100 {
            // SAFETY: the cursor is this thread's; the items point at
            // buffers that outlive the insert (overwrite=true: upsert).
            rc = unsafe {
                wt_set!(c, set_key, &k);
                wt_set!(c, set_value, &v);
                wt!(c, insert)
            };
            if rc != WT_ROLLBACK {
                break;
            }
        }
        check(rc, "insert")
    }

    fn scan(&self, start: &[u8], n: usize) -> CliResult<usize> {
        if n == 0 {
            return Ok(0);
        }
        let b = self.borrow()?;
        let c = b.cursor();
        let k = WtItem::of(start);
        let mut exact: c_int = 0;
        // SAFETY: the cursor is this thread's; `k` outlives the search.
        let mut rc = unsafe {
            wt_set!(c, set_key, &k);
            wt!(c, search_near, &mut exact)
        };
        if rc == 0 && exact < 0 {
            // SAFETY: the cursor is positioned (just before `start`).
            rc = unsafe { wt!(c, next) };
        }
        let mut read = 0usize;
        let mut bytes = 0usize;
        while rc == 0 {
            let (mut key, mut val) = (WtItem::empty(), WtItem::empty());
            // SAFETY: the cursor is positioned; "u" formats fill WT_ITEMs,
            // read before the cursor moves.
            rc = unsafe { wt!(c, get_key, &mut key as *mut WtItem) };
            if rc == 0 {
                // SAFETY: as above.
                rc = unsafe { wt!(c, get_value, &mut val as *mut WtItem) };
            }
            if rc != 0 {
                break;
            }
            bytes += std::hint::black_box(key.size + val.size);
            read += 1;
            if read == n {
                break;
            }
            // SAFETY: the cursor is positioned.
            rc = unsafe { wt!(c, next) };
        }
        std::hint::black_box(bytes);
        if rc != 0 && rc != WT_NOTFOUND {
            check(rc, "scan")?;
        }
        Ok(read)
    }

    fn caveat(&self) -> Option<String> {
        (!self.direct_io).then(|| {
            "WiredTiger without direct I/O: reads also hit the OS page cache, \
             beyond the cache budget"
                .to_string()
        })
    }
}

#[cfg(test)]
mod tests {
    use dana::Durability;

    #[test]
    fn peers_wiredtiger_conformance() {
        super::super::tests::conformance("wiredtiger", Durability::Off);
    }

    #[test]
    fn peers_wiredtiger_conformance_with_an_unsynced_log() {
        super::super::tests::conformance("wiredtiger", Durability::Async);
    }

    #[test]
    fn peers_wiredtiger_conformance_with_synced_writes() {
        super::super::tests::conformance("wiredtiger", Durability::Sync);
    }
}
