//! The initial TPC-C database (spec clause 4.3.3.1), loaded in parallel
//! by many tasks, in transactions of a few hundred rows.
//!
//! Owns: the cardinalities and initial values of every table. Never:
//! leaves a job half done without failing the load (a failed commit
//! fails the command; the directory is recreated by the next run).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dana::{Durability, Isolation};

use super::gen::{last_name, Gen, NuRandC};
use super::kv::{Engine, KvTx, TxError};
use super::schema::{
    by_name_key, key, Customer, District, History, Item, Order, OrderLine, Stock, Table, Warehouse,
};
use super::txns::now_micros;
use crate::{CliError, CliResult};

pub const ITEMS: u32 = 100_000;
pub const DISTRICTS: u32 = 10;
pub const CUSTOMERS: u32 = 3_000;
pub const ORDERS: u32 = 3_000;
/// The first order id that is not delivered at load.
pub const FIRST_NEW_ORDER: u32 = 2_101;
/// Rows per load transaction.
const BATCH: usize = 400;
/// Stock rows per job.
const STOCK_CHUNK: u32 = 10_000;

/// A piece of the load.
#[derive(Debug, Clone, Copy)]
enum Job {
    Items(u32, u32),
    Warehouse(u32),
    Stock(u32, u32, u32),
    District(u32, u32),
}

fn jobs(warehouses: u32) -> Vec<Job> {
    let mut j: Vec<Job> = (0..ITEMS / STOCK_CHUNK)
        .map(|i| Job::Items(i * STOCK_CHUNK + 1, (i + 1) * STOCK_CHUNK))
        .collect();
    for w in 1..=warehouses {
        j.push(Job::Warehouse(w));
        for i in 0..ITEMS / STOCK_CHUNK {
            j.push(Job::Stock(w, i * STOCK_CHUNK + 1, (i + 1) * STOCK_CHUNK));
        }
        for d in 1..=DISTRICTS {
            j.push(Job::District(w, d));
        }
    }
    j
}

/// Rows buffered into load transactions of [`BATCH`] rows.
struct Batch<E: Engine> {
    tables: Arc<E>,
    tx: Option<E::Tx>,
    rows: usize,
    loaded: Arc<AtomicU64>,
}

impl<E: Engine> Batch<E> {
    fn put(&mut self, t: Table, k: &[u8], v: &[u8]) -> CliResult<()> {
        let tx = match &mut self.tx {
            Some(tx) => tx,
            None => self.tx.insert(
                self.tables
                    .begin(Isolation::ReadCommitted, Durability::Async, false)
                    .map_err(failed)?,
            ),
        };
        tx.put(t, k, v).map_err(failed)?;
        self.rows += 1;
        Ok(())
    }

    async fn maybe_commit(&mut self) -> CliResult<()> {
        if self.rows >= BATCH {
            self.commit().await?;
        }
        Ok(())
    }

    async fn commit(&mut self) -> CliResult<()> {
        if let Some(tx) = self.tx.take() {
            tx.commit().await.map_err(failed)?;
            self.loaded.fetch_add(self.rows as u64, Ordering::Relaxed);
            self.rows = 0;
        }
        Ok(())
    }
}

fn failed(e: TxError) -> CliError {
    match e {
        TxError::Conflict => CliError("a load transaction conflicted".into()),
        TxError::Failed(m) => CliError(format!("loading: {m}")),
    }
}

fn address(g: &mut Gen) -> [Vec<u8>; 5] {
    [
        g.astring(10, 20),
        g.astring(10, 20),
        g.astring(10, 20),
        g.astring(2, 2),
        g.zip(),
    ]
}

async fn run_job<E: Engine>(b: &mut Batch<E>, job: Job, seed: u64, c: NuRandC) -> CliResult<()> {
    let mut g = Gen::new(seed, c);
    let now = now_micros();
    match job {
        Job::Items(lo, hi) => {
            for i in lo..=hi {
                let item = Item {
                    im_id: g.u32_in(1, 10_000),
                    name: g.astring(14, 24),
                    price: g.uniform(100, 10_000) as i64,
                    data: g.data_original(),
                };
                b.put(Table::Item, &key(&[i]), &item.encode())?;
                b.maybe_commit().await?;
            }
        }
        Job::Warehouse(w) => {
            let [street_1, street_2, city, state, zip] = address(&mut g);
            let wh = Warehouse {
                name: g.astring(6, 10),
                street_1,
                street_2,
                city,
                state,
                zip,
                tax: g.uniform(0, 2_000) as i64,
                ytd: 30_000_000,
            };
            b.put(Table::Warehouse, &key(&[w]), &wh.encode())?;
            for d in 1..=DISTRICTS {
                let [street_1, street_2, city, state, zip] = address(&mut g);
                let dist = District {
                    name: g.astring(6, 10),
                    street_1,
                    street_2,
                    city,
                    state,
                    zip,
                    tax: g.uniform(0, 2_000) as i64,
                    ytd: 3_000_000,
                    next_o_id: ORDERS + 1,
                };
                b.put(Table::District, &key(&[w, d]), &dist.encode())?;
            }
        }
        Job::Stock(w, lo, hi) => {
            for i in lo..=hi {
                let s = Stock {
                    quantity: g.u32_in(10, 100) as i32,
                    dist: (0..10).flat_map(|_| g.astring(24, 24)).collect(),
                    ytd: 0,
                    order_cnt: 0,
                    remote_cnt: 0,
                    data: g.data_original(),
                };
                b.put(Table::Stock, &key(&[w, i]), &s.encode())?;
                b.maybe_commit().await?;
            }
        }
        Job::District(w, d) => {
            for c in 1..=CUSTOMERS {
                let last = if c <= 1000 {
                    last_name(c - 1)
                } else {
                    last_name(g.nurand(255, 0, 999) as u32)
                };
                let [street_1, street_2, city, state, zip] = address(&mut g);
                let cust = Customer {
                    first: g.astring(8, 16),
                    middle: b"OE".to_vec(),
                    last,
                    street_1,
                    street_2,
                    city,
                    state,
                    zip,
                    phone: g.nstring(16),
                    since: now,
                    credit: if g.uniform(1, 10) == 1 { b"BC" } else { b"GC" }.to_vec(),
                    credit_lim: 5_000_000,
                    discount: g.uniform(0, 5_000) as i64,
                    balance: -1_000,
                    ytd_payment: 1_000,
                    payment_cnt: 1,
                    delivery_cnt: 0,
                    data: g.astring(300, 500),
                };
                b.put(
                    Table::CustomerByName,
                    &by_name_key(w, d, &cust.last, &cust.first, c),
                    &[],
                )?;
                b.put(Table::Customer, &key(&[w, d, c]), &cust.encode())?;
                let h = History {
                    c_id: c,
                    c_d_id: d,
                    c_w_id: w,
                    d_id: d,
                    w_id: w,
                    date: now,
                    amount: 1_000,
                    data: g.astring(12, 24),
                };
                let mut hk = key(&[w, d]);
                hk.extend_from_slice(&u64::from(c).to_be_bytes());
                b.put(Table::History, &hk, &h.encode())?;
                b.maybe_commit().await?;
            }
            // Orders name the customers in a random permutation.
            let mut perm: Vec<u32> = (1..=CUSTOMERS).collect();
            for i in (1..perm.len()).rev() {
                let j = g.below(i as u64 + 1) as usize;
                perm.swap(i, j);
            }
            for o in 1..=ORDERS {
                let delivered = o < FIRST_NEW_ORDER;
                let c = perm[o as usize - 1];
                let order = Order {
                    c_id: c,
                    entry_d: now,
                    carrier_id: if delivered { g.u32_in(1, 10) } else { 0 },
                    ol_cnt: g.u32_in(5, 15),
                    all_local: 1,
                };
                b.put(Table::Order, &key(&[w, d, o]), &order.encode())?;
                b.put(Table::OrderByCustomer, &key(&[w, d, c, o]), &[])?;
                for n in 1..=order.ol_cnt {
                    let line = OrderLine {
                        i_id: g.u32_in(1, ITEMS),
                        supply_w_id: w,
                        delivery_d: if delivered { now } else { 0 },
                        quantity: 5,
                        amount: if delivered {
                            0
                        } else {
                            g.uniform(1, 999_999) as i64
                        },
                        dist_info: g.astring(24, 24),
                    };
                    b.put(Table::OrderLine, &key(&[w, d, o, n]), &line.encode())?;
                }
                if !delivered {
                    b.put(Table::NewOrder, &key(&[w, d, o]), &[])?;
                }
                b.maybe_commit().await?;
            }
        }
    }
    b.commit().await
}

/// Loads `warehouses` warehouses with `tasks` loader tasks; `progress`
/// is called with the rows loaded so far, from the calling thread, until
/// the load is done. Returns the rows loaded.
pub fn load<E: Engine>(
    tables: &Arc<E>,
    warehouses: u32,
    tasks: usize,
    seed: u64,
    mut progress: impl FnMut(u64),
) -> CliResult<u64> {
    let jobs = Arc::new(jobs(warehouses));
    let next = Arc::new(AtomicUsize::new(0));
    let loaded = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let error: Arc<Mutex<Option<CliError>>> = Arc::new(Mutex::new(None));
    let c = NuRandC::load(seed);
    for task in 0..tasks {
        let (jobs, next, loaded, finished, error) = (
            jobs.clone(),
            next.clone(),
            loaded.clone(),
            finished.clone(),
            error.clone(),
        );
        let mut b = Batch {
            tables: tables.clone(),
            tx: None,
            rows: 0,
            loaded,
        };
        tables.spawn(task, async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&job) = jobs.get(i) else {
                    break;
                };
                if let Err(e) = run_job(&mut b, job, seed ^ ((i as u64 + 1) * 0x9e37), c).await {
                    *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    next.store(usize::MAX / 2, Ordering::Relaxed);
                    break;
                }
            }
            finished.fetch_add(1, Ordering::Release);
        })?;
    }
    while finished.load(Ordering::Acquire) < tasks {
        std::thread::sleep(std::time::Duration::from_millis(100));
        progress(loaded.load(Ordering::Relaxed));
    }
    if let Some(e) = error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(e);
    }
    Ok(loaded.load(Ordering::Relaxed))
}
