//! The five TPC-C transactions (spec clauses 2.4 to 2.8), their inputs
//! and their bodies, written once against [`KvTx`].
//!
//! Owns: drawing each transaction's input ([`Input::draw`]) and running
//! its body inside one engine transaction. Never: commits a New-Order
//! that names an unused item (the 1% the spec rolls back), or skips a
//! district in Delivery (all ten, in one transaction).

use std::ops::Bound::{Excluded, Included};

use super::gen::Gen;
use super::kv::{KvTx, TxError, TxResult};
use super::schema::{
    by_name_prefix, key, last_id, Customer, District, History, Item, Order, OrderLine, Stock,
    Table, Warehouse,
};

/// The five transaction types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NewOrder,
    Payment,
    OrderStatus,
    Delivery,
    StockLevel,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::NewOrder,
        Kind::Payment,
        Kind::OrderStatus,
        Kind::Delivery,
        Kind::StockLevel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::NewOrder => "New-Order",
            Kind::Payment => "Payment",
            Kind::OrderStatus => "Order-Status",
            Kind::Delivery => "Delivery",
            Kind::StockLevel => "Stock-Level",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// True for the types that only read (Order-Status, Stock-Level).
    pub fn read_only(self) -> bool {
        matches!(self, Kind::OrderStatus | Kind::StockLevel)
    }

    /// The standard mix: 45% New-Order, 43% Payment, 4% each of the rest.
    pub fn draw(g: &mut Gen) -> Kind {
        match g.uniform(1, 100) {
            1..=45 => Kind::NewOrder,
            46..=88 => Kind::Payment,
            89..=92 => Kind::OrderStatus,
            93..=96 => Kind::Delivery,
            _ => Kind::StockLevel,
        }
    }
}

/// One order line of a New-Order input.
#[derive(Debug, Clone)]
pub struct LineInput {
    pub item: u32,
    pub supply_w: u32,
    pub quantity: u32,
}

/// A customer named by id or by last name.
#[derive(Debug, Clone)]
pub enum Who {
    Id(u32),
    LastName(Vec<u8>),
}

/// A transaction's input, drawn before its first attempt (a retry runs
/// the same input again).
#[derive(Debug, Clone)]
pub enum Input {
    NewOrder {
        w: u32,
        d: u32,
        c: u32,
        lines: Vec<LineInput>,
    },
    Payment {
        w: u32,
        d: u32,
        c_w: u32,
        c_d: u32,
        who: Who,
        amount: i64,
    },
    OrderStatus {
        w: u32,
        d: u32,
        who: Who,
    },
    Delivery {
        w: u32,
        carrier: u32,
    },
    StockLevel {
        w: u32,
        d: u32,
        threshold: i32,
    },
}

/// An item id no item has (the 1% of New-Orders that roll back).
pub const UNUSED_ITEM: u32 = 100_001;

fn other_warehouse(g: &mut Gen, w: u32, warehouses: u32) -> u32 {
    if warehouses <= 1 {
        return w;
    }
    let o = g.u32_in(1, warehouses - 1);
    if o >= w {
        o + 1
    } else {
        o
    }
}

fn who(g: &mut Gen) -> Who {
    if g.uniform(1, 100) <= 60 {
        Who::LastName(g.run_last_name())
    } else {
        Who::Id(g.customer_id())
    }
}

impl Input {
    /// The input of a transaction of kind `k` for home warehouse `w`.
    pub fn draw(k: Kind, g: &mut Gen, w: u32, warehouses: u32) -> Input {
        match k {
            Kind::NewOrder => {
                let d = g.u32_in(1, 10);
                let c = g.customer_id();
                let n = g.u32_in(5, 15);
                let rollback = g.uniform(1, 100) == 1;
                let lines = (0..n)
                    .map(|i| LineInput {
                        item: if rollback && i == n - 1 {
                            UNUSED_ITEM
                        } else {
                            g.item_id()
                        },
                        supply_w: if g.uniform(1, 100) == 1 {
                            other_warehouse(g, w, warehouses)
                        } else {
                            w
                        },
                        quantity: g.u32_in(1, 10),
                    })
                    .collect();
                Input::NewOrder { w, d, c, lines }
            }
            Kind::Payment => {
                let d = g.u32_in(1, 10);
                let (c_w, c_d) = if g.uniform(1, 100) <= 85 || warehouses == 1 {
                    (w, d)
                } else {
                    (other_warehouse(g, w, warehouses), g.u32_in(1, 10))
                };
                Input::Payment {
                    w,
                    d,
                    c_w,
                    c_d,
                    who: who(g),
                    amount: g.uniform(100, 500_000) as i64,
                }
            }
            Kind::OrderStatus => Input::OrderStatus {
                w,
                d: g.u32_in(1, 10),
                who: who(g),
            },
            Kind::Delivery => Input::Delivery {
                w,
                carrier: g.u32_in(1, 10),
            },
            Kind::StockLevel => Input::StockLevel {
                w,
                d: g.u32_in(1, 10),
                threshold: g.u32_in(10, 20) as i32,
            },
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Input::NewOrder { .. } => Kind::NewOrder,
            Input::Payment { .. } => Kind::Payment,
            Input::OrderStatus { .. } => Kind::OrderStatus,
            Input::Delivery { .. } => Kind::Delivery,
            Input::StockLevel { .. } => Kind::StockLevel,
        }
    }
}

/// How a transaction body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Commit it (a New-Order names its order: warehouse, district, id).
    Commit(Option<(u32, u32, u32)>),
    /// Roll it back (New-Order's unused item): nothing it wrote may
    /// remain.
    Rollback,
}

/// µs since the epoch.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
}

/// The row of `k` in `t`, decoded; missing is an error.
async fn row<T: KvTx, R>(
    tx: &mut T,
    t: Table,
    k: &[u8],
    decode: impl Fn(&[u8]) -> crate::CliResult<R>,
) -> TxResult<R> {
    let v = tx.get(t, k).await?;
    present(t, k, v, decode)
}

/// [`row`] of a row the transaction will update.
async fn row_for_update<T: KvTx, R>(
    tx: &mut T,
    t: Table,
    k: &[u8],
    decode: impl Fn(&[u8]) -> crate::CliResult<R>,
) -> TxResult<R> {
    let v = tx.get_for_update(t, k).await?;
    present(t, k, v, decode)
}

fn present<R>(
    t: Table,
    k: &[u8],
    v: Option<Vec<u8>>,
    decode: impl Fn(&[u8]) -> crate::CliResult<R>,
) -> TxResult<R> {
    match v {
        Some(v) => Ok(decode(&v)?),
        None => Err(TxError::Failed(format!(
            "{} row {k:?} is missing",
            t.name()
        ))),
    }
}

/// The customer of (w, d) named by `who`: by id, or the one at position
/// ceil(n/2) of those with that last name, sorted by first name;
/// `for_update` if the transaction will update it.
async fn customer<T: KvTx>(
    tx: &mut T,
    w: u32,
    d: u32,
    who: &Who,
    for_update: bool,
) -> TxResult<(u32, Customer)> {
    let c = match who {
        Who::Id(c) => *c,
        Who::LastName(last) => {
            let p = by_name_prefix(w, d, last);
            let found = tx
                .scan_prefix(Table::CustomerByName, &p, true, 3000)
                .await?;
            if found.is_empty() {
                return Err(TxError::Failed(format!(
                    "no customer of warehouse {w} district {d} is named {}",
                    String::from_utf8_lossy(last)
                )));
            }
            last_id(&found[found.len().div_ceil(2) - 1].0)?
        }
    };
    let k = key(&[w, d, c]);
    let row = if for_update {
        row_for_update(tx, Table::Customer, &k, Customer::decode).await?
    } else {
        row(tx, Table::Customer, &k, Customer::decode).await?
    };
    Ok((c, row))
}

/// Runs the body of `input` in `tx`.
pub async fn run<T: KvTx>(tx: &mut T, input: &Input, history_id: u64) -> TxResult<Outcome> {
    match input {
        Input::NewOrder { w, d, c, lines } => new_order(tx, *w, *d, *c, lines).await,
        Input::Payment {
            w,
            d,
            c_w,
            c_d,
            who,
            amount,
        } => payment(tx, (*w, *d), (*c_w, *c_d), who, *amount, history_id).await,
        Input::OrderStatus { w, d, who } => order_status(tx, *w, *d, who).await,
        Input::Delivery { w, carrier } => delivery(tx, *w, *carrier).await,
        Input::StockLevel { w, d, threshold } => stock_level(tx, *w, *d, *threshold).await,
    }
}

async fn new_order<T: KvTx>(
    tx: &mut T,
    w: u32,
    d: u32,
    c: u32,
    lines: &[LineInput],
) -> TxResult<Outcome> {
    let wh = row(tx, Table::Warehouse, &key(&[w]), Warehouse::decode).await?;
    let dk = key(&[w, d]);
    let mut dist = row_for_update(tx, Table::District, &dk, District::decode).await?;
    let o = dist.next_o_id;
    dist.next_o_id += 1;
    tx.put(Table::District, &dk, &dist.encode())?;
    let cust = row(tx, Table::Customer, &key(&[w, d, c]), Customer::decode).await?;
    let now = now_micros();
    let all_local = lines.iter().all(|l| l.supply_w == w);
    let order = Order {
        c_id: c,
        entry_d: now,
        carrier_id: 0,
        ol_cnt: lines.len() as u32,
        all_local: u32::from(all_local),
    };
    tx.put(Table::Order, &key(&[w, d, o]), &order.encode())?;
    tx.put(Table::NewOrder, &key(&[w, d, o]), &[])?;
    tx.put(Table::OrderByCustomer, &key(&[w, d, c, o]), &[])?;
    let mut total = 0i64;
    for (n, l) in lines.iter().enumerate() {
        let Some(item) = tx.get(Table::Item, &key(&[l.item])).await? else {
            // "Item number is not valid": the spec's rollback.
            return Ok(Outcome::Rollback);
        };
        let item = Item::decode(&item)?;
        let sk = key(&[l.supply_w, l.item]);
        let mut s = row_for_update(tx, Table::Stock, &sk, Stock::decode).await?;
        let q = l.quantity as i32;
        s.quantity = if s.quantity >= q + 10 {
            s.quantity - q
        } else {
            s.quantity - q + 91
        };
        s.ytd += u64::from(l.quantity);
        s.order_cnt += 1;
        if l.supply_w != w {
            s.remote_cnt += 1;
        }
        tx.put(Table::Stock, &sk, &s.encode())?;
        let amount = i64::from(l.quantity) * item.price;
        total += amount;
        let line = OrderLine {
            i_id: l.item,
            supply_w_id: l.supply_w,
            delivery_d: 0,
            quantity: l.quantity,
            amount,
            dist_info: s.dist_of(d),
        };
        tx.put(
            Table::OrderLine,
            &key(&[w, d, o, n as u32 + 1]),
            &line.encode(),
        )?;
    }
    // The total the terminal would display (computed as the spec says).
    let _total = total * (10_000 - cust.discount) / 10_000 * (10_000 + wh.tax + dist.tax) / 10_000;
    Ok(Outcome::Commit(Some((w, d, o))))
}

async fn payment<T: KvTx>(
    tx: &mut T,
    (w, d): (u32, u32),
    (c_w, c_d): (u32, u32),
    who: &Who,
    amount: i64,
    history_id: u64,
) -> TxResult<Outcome> {
    let wk = key(&[w]);
    let mut wh = row_for_update(tx, Table::Warehouse, &wk, Warehouse::decode).await?;
    wh.ytd += amount;
    tx.put(Table::Warehouse, &wk, &wh.encode())?;
    let dk = key(&[w, d]);
    let mut dist = row_for_update(tx, Table::District, &dk, District::decode).await?;
    dist.ytd += amount;
    tx.put(Table::District, &dk, &dist.encode())?;
    let (c, mut cust) = customer(tx, c_w, c_d, who, true).await?;
    cust.balance -= amount;
    cust.ytd_payment += amount;
    cust.payment_cnt += 1;
    if cust.credit == b"BC" {
        let mut data = format!("{c} {c_d} {c_w} {d} {w} {amount}|").into_bytes();
        data.extend_from_slice(&cust.data);
        data.truncate(500);
        cust.data = data;
    }
    tx.put(Table::Customer, &key(&[c_w, c_d, c]), &cust.encode())?;
    let mut h_data = wh.name.clone();
    h_data.extend_from_slice(b"    ");
    h_data.extend_from_slice(&dist.name);
    let h = History {
        c_id: c,
        c_d_id: c_d,
        c_w_id: c_w,
        d_id: d,
        w_id: w,
        date: now_micros(),
        amount,
        data: h_data,
    };
    let mut hk = key(&[w, d]);
    hk.extend_from_slice(&history_id.to_be_bytes());
    tx.put(Table::History, &hk, &h.encode())?;
    Ok(Outcome::Commit(None))
}

async fn order_status<T: KvTx>(tx: &mut T, w: u32, d: u32, who: &Who) -> TxResult<Outcome> {
    let (c, _cust) = customer(tx, w, d, who, false).await?;
    let p = key(&[w, d, c]);
    let last = tx.scan_prefix(Table::OrderByCustomer, &p, false, 1).await?;
    if let Some((k, _)) = last.first() {
        let o = last_id(k)?;
        let _order = row(tx, Table::Order, &key(&[w, d, o]), Order::decode).await?;
        let lp = key(&[w, d, o]);
        for (_, v) in tx.scan_prefix(Table::OrderLine, &lp, true, 20).await? {
            OrderLine::decode(&v)?;
        }
    }
    Ok(Outcome::Commit(None))
}

async fn delivery<T: KvTx>(tx: &mut T, w: u32, carrier: u32) -> TxResult<Outcome> {
    let now = now_micros();
    for d in 1..=10 {
        let p = key(&[w, d]);
        let oldest = tx.scan_prefix(Table::NewOrder, &p, true, 1).await?;
        let Some((nk, _)) = oldest.first() else {
            continue;
        };
        let o = last_id(nk)?;
        tx.delete(Table::NewOrder, nk)?;
        let ok = key(&[w, d, o]);
        let mut order = row_for_update(tx, Table::Order, &ok, Order::decode).await?;
        order.carrier_id = carrier;
        tx.put(Table::Order, &ok, &order.encode())?;
        let mut sum = 0;
        for (k, v) in tx.scan_prefix(Table::OrderLine, &ok, true, 20).await? {
            let mut line = OrderLine::decode(&v)?;
            line.delivery_d = now;
            sum += line.amount;
            tx.put(Table::OrderLine, &k, &line.encode())?;
        }
        let ck = key(&[w, d, order.c_id]);
        let mut cust = row_for_update(tx, Table::Customer, &ck, Customer::decode).await?;
        cust.balance += sum;
        cust.delivery_cnt += 1;
        tx.put(Table::Customer, &ck, &cust.encode())?;
    }
    Ok(Outcome::Commit(None))
}

async fn stock_level<T: KvTx>(tx: &mut T, w: u32, d: u32, threshold: i32) -> TxResult<Outcome> {
    let dist = row(tx, Table::District, &key(&[w, d]), District::decode).await?;
    let next = dist.next_o_id;
    let lo = key(&[w, d, next.saturating_sub(20)]);
    let hi = key(&[w, d, next]);
    let mut items: Vec<u32> = Vec::new();
    for (_, v) in tx
        .scan(
            Table::OrderLine,
            Included(&lo),
            Excluded(&hi),
            true,
            20 * 15,
        )
        .await?
    {
        items.push(OrderLine::decode(&v)?.i_id);
    }
    items.sort_unstable();
    items.dedup();
    // The terminal's answer: items of the last 20 orders low in stock.
    let mut _low = 0;
    for i in items {
        let s = row(tx, Table::Stock, &key(&[w, i]), Stock::decode).await?;
        if s.quantity < threshold {
            _low += 1;
        }
    }
    Ok(Outcome::Commit(None))
}
