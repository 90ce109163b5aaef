//! Helpers shared by the buffer-pool tests: pages that hold their own id
//! and an update counter after the header.

use std::sync::Arc;

use dana::buffer::{BufferPool, PageType, PAGE_HEADER_SIZE};
use dana::sched::Runtime;
use dana::Error;

/// (page id stored in the page, update counter) of a page.
pub fn counter(page: &[u8]) -> (u64, u64) {
    let at = PAGE_HEADER_SIZE;
    (
        u64::from_le_bytes(page[at..at + 8].try_into().unwrap()),
        u64::from_le_bytes(page[at + 8..at + 16].try_into().unwrap()),
    )
}

/// Formats the pool, allocates `n` pages each holding its own id and a
/// zero counter, flushes; returns their ids.
pub fn fill(pool: &Arc<BufferPool>, rt: &Runtime, n: u64) -> Vec<u64> {
    let p = pool.clone();
    rt.block_on(async move {
        p.format().await?;
        let mut pids = Vec::new();
        for _ in 0..n {
            let mut g = p.allocate(PageType::Raw).await?;
            let pid = g.pid();
            g[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + 8].copy_from_slice(&pid.to_le_bytes());
            pids.push(pid);
        }
        p.flush_all().await?;
        Ok::<_, Error>(pids)
    })
    .unwrap()
    .unwrap()
}
