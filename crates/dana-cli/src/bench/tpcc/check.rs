//! TPC-C's consistency conditions (spec clause 3.3.2), checked over the
//! whole database after a run or a recovery.
//!
//! Owns: conditions 1 to 10 and 12, plus the two secondary indexes
//! against their tables. Never: reports success after a violation: every
//! violation is counted and the first ones are named.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::kv::Engine;
use super::schema::{
    key, last_id, part, Customer, District, History, Order, OrderLine, Table, Warehouse,
};
use super::txns::UNUSED_ITEM;
use crate::{CliError, CliResult};

/// What the check found.
#[derive(Debug, Default, serde::Serialize)]
pub struct Consistency {
    /// Conditions checked (by number; 13 and 14 are the indexes, 15 no
    /// line of a rolled-back New-Order).
    pub conditions: Vec<u32>,
    /// Violations found.
    pub violations: u64,
    /// The first violations, described.
    pub first: Vec<String>,
    /// Rows read.
    pub rows: u64,
}

impl Consistency {
    fn violated(&mut self, what: String) {
        self.violations += 1;
        if self.first.len() < 10 {
            self.first.push(what);
        }
    }

    /// An error naming the first violations, if any.
    pub fn ok(&self) -> CliResult<()> {
        if self.violations == 0 {
            return Ok(());
        }
        Err(CliError(format!(
            "TPC-C consistency: {} violation(s); first: {}",
            self.violations,
            self.first.join("; ")
        )))
    }
}

fn each<E: Engine>(
    tables: &E,
    t: Table,
    rows: &mut u64,
    mut f: impl FnMut(&[u8], &[u8]) -> CliResult<()>,
) -> CliResult<()> {
    tables.each(t, &mut |k, v| {
        *rows += 1;
        f(k, v)
    })
}

#[derive(Default, Clone, Copy)]
struct OrderFacts {
    c: u32,
    carrier: u32,
    ol_cnt: u32,
    lines: u32,
    new_order: bool,
}

#[derive(Default)]
struct DistrictFacts {
    next_o_id: u32,
    ytd: i64,
    max_o: u32,
    no_min: Option<u32>,
    no_max: u32,
    no_count: u32,
    ol_cnt_sum: u64,
    lines: u64,
    history: i64,
}

/// Checks every condition over the whole database.
pub fn check<E: Engine>(tables: &E) -> CliResult<Consistency> {
    let mut out = Consistency {
        conditions: vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15],
        ..Consistency::default()
    };
    let mut rows = 0u64;
    let mut w_ytd: BTreeMap<u32, (i64, i64, i64)> = BTreeMap::new(); // (W_YTD, sum D_YTD, sum H)
    let mut districts: BTreeMap<(u32, u32), DistrictFacts> = BTreeMap::new();
    each(tables, Table::Warehouse, &mut rows, |k, v| {
        w_ytd.entry(part(k, 0)?).or_default().0 = Warehouse::decode(v)?.ytd;
        Ok(())
    })?;
    each(tables, Table::District, &mut rows, |k, v| {
        let d = District::decode(v)?;
        let (w, di) = (part(k, 0)?, part(k, 1)?);
        w_ytd.entry(w).or_default().1 += d.ytd;
        let f = districts.entry((w, di)).or_default();
        f.next_o_id = d.next_o_id;
        f.ytd = d.ytd;
        Ok(())
    })?;
    let mut orders: HashMap<(u32, u32, u32), OrderFacts> = HashMap::new();
    each(tables, Table::Order, &mut rows, |k, v| {
        let o = Order::decode(v)?;
        let id = (part(k, 0)?, part(k, 1)?, part(k, 2)?);
        let f = districts.entry((id.0, id.1)).or_default();
        f.max_o = f.max_o.max(id.2);
        f.ol_cnt_sum += u64::from(o.ol_cnt);
        orders.insert(
            id,
            OrderFacts {
                c: o.c_id,
                carrier: o.carrier_id,
                ol_cnt: o.ol_cnt,
                ..OrderFacts::default()
            },
        );
        Ok(())
    })?;
    let mut missing = Vec::new();
    each(tables, Table::NewOrder, &mut rows, |k, _| {
        let id = (part(k, 0)?, part(k, 1)?, part(k, 2)?);
        let f = districts.entry((id.0, id.1)).or_default();
        f.no_min = Some(f.no_min.map_or(id.2, |m| m.min(id.2)));
        f.no_max = f.no_max.max(id.2);
        f.no_count += 1;
        match orders.get_mut(&id) {
            Some(o) => o.new_order = true,
            None => missing.push(format!("new-order {id:?} has no order")),
        }
        Ok(())
    })?;
    for m in missing.drain(..) {
        out.violated(m);
    }
    // Delivered order-line amounts per customer (conditions 10 and 12).
    let mut delivered: HashMap<(u32, u32, u32), i64> = HashMap::new();
    let mut bad_lines = Vec::new();
    each(tables, Table::OrderLine, &mut rows, |k, v| {
        let l = OrderLine::decode(v)?;
        let id = (part(k, 0)?, part(k, 1)?, part(k, 2)?);
        districts.entry((id.0, id.1)).or_default().lines += 1;
        if l.i_id == UNUSED_ITEM {
            bad_lines.push(format!(
                "rollback: order line {k:?} names the unused item of a rolled-back New-Order"
            ));
        }
        match orders.get_mut(&id) {
            None => bad_lines.push(format!("order line {k:?} has no order")),
            Some(o) => {
                o.lines += 1;
                if (o.carrier == 0) != (l.delivery_d == 0) {
                    bad_lines.push(format!(
                        "condition 7: order {id:?} carrier {} but a line's delivery date {}",
                        o.carrier, l.delivery_d
                    ));
                }
                if l.delivery_d != 0 {
                    *delivered.entry((id.0, id.1, o.c)).or_default() += l.amount;
                }
            }
        }
        Ok(())
    })?;
    for m in bad_lines {
        out.violated(m);
    }
    let mut paid: HashMap<(u32, u32, u32), i64> = HashMap::new();
    each(tables, Table::History, &mut rows, |_, v| {
        let h = History::decode(v)?;
        w_ytd.entry(h.w_id).or_default().2 += h.amount;
        districts.entry((h.w_id, h.d_id)).or_default().history += h.amount;
        *paid.entry((h.c_w_id, h.c_d_id, h.c_id)).or_default() += h.amount;
        Ok(())
    })?;
    for (w, (ytd, d_sum, h_sum)) in &w_ytd {
        if ytd != d_sum {
            out.violated(format!(
                "condition 1: W_YTD {ytd} != sum(D_YTD) {d_sum} (w {w})"
            ));
        }
        if ytd != h_sum {
            out.violated(format!(
                "condition 8: W_YTD {ytd} != sum(H_AMOUNT) {h_sum} (w {w})"
            ));
        }
    }
    for ((w, d), f) in &districts {
        let at = format!("(w {w}, d {d})");
        if f.next_o_id.wrapping_sub(1) != f.max_o {
            out.violated(format!(
                "condition 2: D_NEXT_O_ID - 1 = {} != max(O_ID) {} {at}",
                f.next_o_id.wrapping_sub(1),
                f.max_o
            ));
        }
        if let Some(min) = f.no_min {
            if f.no_max != f.max_o {
                out.violated(format!(
                    "condition 2: max(NO_O_ID) {} != max(O_ID) {} {at}",
                    f.no_max, f.max_o
                ));
            }
            if f.no_max - min + 1 != f.no_count {
                out.violated(format!(
                    "condition 3: new orders {min}..={} but {} rows {at}",
                    f.no_max, f.no_count
                ));
            }
        }
        if f.ol_cnt_sum != f.lines {
            out.violated(format!(
                "condition 4: sum(O_OL_CNT) {} != order lines {} {at}",
                f.ol_cnt_sum, f.lines
            ));
        }
        if f.ytd != f.history {
            out.violated(format!(
                "condition 9: D_YTD {} != sum(H_AMOUNT) {} {at}",
                f.ytd, f.history
            ));
        }
    }
    for (id, o) in &orders {
        if (o.carrier == 0) != o.new_order {
            out.violated(format!(
                "condition 5: order {id:?} carrier {} but new-order row {}",
                o.carrier, o.new_order
            ));
        }
        if o.ol_cnt != o.lines {
            out.violated(format!(
                "condition 6: order {id:?} O_OL_CNT {} but {} lines",
                o.ol_cnt, o.lines
            ));
        }
    }
    // Customers: conditions 10 and 12, and the by-name index (13).
    let mut by_name: HashSet<Vec<u8>> = HashSet::new();
    each(tables, Table::CustomerByName, &mut rows, |k, _| {
        by_name.insert(k.to_vec());
        Ok(())
    })?;
    let mut bad = Vec::new();
    each(tables, Table::Customer, &mut rows, |k, v| {
        let c = Customer::decode(v)?;
        let id = (part(k, 0)?, part(k, 1)?, part(k, 2)?);
        let del = delivered.get(&id).copied().unwrap_or(0);
        let pay = paid.get(&id).copied().unwrap_or(0);
        if c.balance != del - pay {
            bad.push(format!(
                "condition 10: customer {id:?} balance {} != delivered {del} - paid {pay}",
                c.balance
            ));
        }
        if c.balance + c.ytd_payment != del {
            bad.push(format!(
                "condition 12: customer {id:?} balance + ytd {} != delivered {del}",
                c.balance + c.ytd_payment
            ));
        }
        let nk = super::schema::by_name_key(id.0, id.1, &c.last, &c.first, id.2);
        if !by_name.remove(&nk) {
            bad.push(format!(
                "index: customer {id:?} is not in the by-name index"
            ));
        }
        Ok(())
    })?;
    for m in bad {
        out.violated(m);
    }
    if !by_name.is_empty() {
        out.violated(format!(
            "index: {} by-name entries name no customer",
            by_name.len()
        ));
    }
    // Orders by customer (14): one entry per order, naming its customer.
    let mut indexed = 0u64;
    let mut bad = Vec::new();
    each(tables, Table::OrderByCustomer, &mut rows, |k, _| {
        indexed += 1;
        let (w, d, c, o) = (part(k, 0)?, part(k, 1)?, part(k, 2)?, last_id(k)?);
        match orders.get(&(w, d, o)) {
            Some(f) if f.c == c => {}
            _ => bad.push(format!(
                "index: orders-by-customer {:?} names no such order",
                key(&[w, d, c, o])
            )),
        }
        Ok(())
    })?;
    for m in bad {
        out.violated(m);
    }
    if indexed != orders.len() as u64 {
        out.violated(format!(
            "index: {} orders but {indexed} orders-by-customer entries",
            orders.len()
        ));
    }
    out.rows = rows;
    Ok(out)
}
