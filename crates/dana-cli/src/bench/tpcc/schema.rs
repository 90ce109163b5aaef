//! The TPC-C tables as key-value trees: order-preserving composite keys
//! and compact binary rows.
//!
//! Owns: the key layout of the nine tables and the two secondary indexes
//! (customer by last name, orders by customer), and the row codecs.
//! Never: stores a value it cannot decode again (every row round-trips;
//! a row that fails to decode is an error naming its table, not a
//! guess).
//!
//! Keys are the big-endian concatenation of the primary key's integer
//! columns, so key order is the primary key's order and a prefix selects
//! a warehouse, a district, a customer or an order. Money is in cents
//! (i64), rates in 1/10,000 (i64), dates in µs since the epoch (0: null),
//! carrier 0: null.

use crate::{CliError, CliResult};

/// The trees: the nine tables and the two secondary indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    Warehouse,
    District,
    Customer,
    History,
    NewOrder,
    Order,
    OrderLine,
    Item,
    Stock,
    /// (w, d, c_last, c_first, c_id) -> empty.
    CustomerByName,
    /// (w, d, c_id, o_id) -> empty.
    OrderByCustomer,
}

impl Table {
    /// Every table, in a fixed order (its index is its slot).
    pub const ALL: [Table; 11] = [
        Table::Warehouse,
        Table::District,
        Table::Customer,
        Table::History,
        Table::NewOrder,
        Table::Order,
        Table::OrderLine,
        Table::Item,
        Table::Stock,
        Table::CustomerByName,
        Table::OrderByCustomer,
    ];

    /// The tree's name.
    pub fn name(self) -> &'static str {
        match self {
            Table::Warehouse => "warehouse",
            Table::District => "district",
            Table::Customer => "customer",
            Table::History => "history",
            Table::NewOrder => "new_order",
            Table::Order => "order",
            Table::OrderLine => "order_line",
            Table::Item => "item",
            Table::Stock => "stock",
            Table::CustomerByName => "customer_by_name",
            Table::OrderByCustomer => "order_by_customer",
        }
    }

    /// Slot in [`Table::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Big-endian concatenation of `parts`.
pub fn key(parts: &[u32]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.len() * 4);
    for p in parts {
        k.extend_from_slice(&p.to_be_bytes());
    }
    k
}

/// Width of the name columns in the by-name index (padded with zeros).
pub const NAME_WIDTH: usize = 16;

/// Customer-by-name index key.
pub fn by_name_key(w: u32, d: u32, last: &[u8], first: &[u8], c: u32) -> Vec<u8> {
    let mut k = key(&[w, d]);
    k.extend_from_slice(&padded(last));
    k.extend_from_slice(&padded(first));
    k.extend_from_slice(&c.to_be_bytes());
    k
}

/// The prefix of every customer of (w, d) named `last`.
pub fn by_name_prefix(w: u32, d: u32, last: &[u8]) -> Vec<u8> {
    let mut k = key(&[w, d]);
    k.extend_from_slice(&padded(last));
    k
}

fn padded(s: &[u8]) -> [u8; NAME_WIDTH] {
    let mut out = [0u8; NAME_WIDTH];
    let n = s.len().min(NAME_WIDTH);
    out[..n].copy_from_slice(&s[..n]);
    out
}

/// The last four bytes of a key as a u32 (the id it ends with).
pub fn last_id(k: &[u8]) -> CliResult<u32> {
    k.len()
        .checked_sub(4)
        .map(|s| u32::from_be_bytes([k[s], k[s + 1], k[s + 2], k[s + 3]]))
        .ok_or_else(|| CliError(format!("a TPC-C key of {} bytes has no id", k.len())))
}

/// The u32 at position `i` (0-based) of a composite key.
pub fn part(k: &[u8], i: usize) -> CliResult<u32> {
    k.get(i * 4..i * 4 + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| CliError(format!("a TPC-C key of {} bytes has no part {i}", k.len())))
}

/// A column type of a row.
pub trait Field: Sized {
    fn put(&self, out: &mut Vec<u8>);
    fn take(input: &mut &[u8]) -> Option<Self>;
}

fn take_n<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if input.len() < n {
        return None;
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Some(head)
}

macro_rules! int_field {
    ($t:ty) => {
        impl Field for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(input: &mut &[u8]) -> Option<Self> {
                let b = take_n(input, std::mem::size_of::<$t>())?;
                Some(<$t>::from_le_bytes(b.try_into().ok()?))
            }
        }
    };
}
int_field!(u32);
int_field!(i32);
int_field!(u64);
int_field!(i64);

impl Field for Vec<u8> {
    fn put(&self, out: &mut Vec<u8>) {
        debug_assert!(self.len() <= u16::MAX as usize);
        out.extend_from_slice(&(self.len() as u16).to_le_bytes());
        out.extend_from_slice(self);
    }
    fn take(input: &mut &[u8]) -> Option<Self> {
        let n = u16::from_le_bytes(take_n(input, 2)?.try_into().ok()?) as usize;
        Some(take_n(input, n)?.to_vec())
    }
}

/// A row struct with `encode` and `decode` over its fields in order.
macro_rules! row {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fdoc])* pub $f: $t),* }
        impl $name {
            /// The row's bytes.
            pub fn encode(&self) -> Vec<u8> {
                let mut out = Vec::with_capacity(64);
                $(Field::put(&self.$f, &mut out);)*
                out
            }
            /// The row from its bytes.
            pub fn decode(bytes: &[u8]) -> CliResult<$name> {
                let mut input = bytes;
                let row = (|| Some($name { $($f: Field::take(&mut input)?),* }))();
                match row {
                    Some(r) if input.is_empty() => Ok(r),
                    _ => Err(CliError(format!(
                        "a {} row of {} bytes does not decode", stringify!($name), bytes.len()
                    ))),
                }
            }
        }
    };
}

row!(
    /// WAREHOUSE (key: w).
    Warehouse {
        name: Vec<u8>,
        street_1: Vec<u8>,
        street_2: Vec<u8>,
        city: Vec<u8>,
        state: Vec<u8>,
        zip: Vec<u8>,
        /// 1/10,000.
        tax: i64,
        /// Cents.
        ytd: i64,
    }
);

row!(
    /// DISTRICT (key: w, d).
    District {
        name: Vec<u8>,
        street_1: Vec<u8>,
        street_2: Vec<u8>,
        city: Vec<u8>,
        state: Vec<u8>,
        zip: Vec<u8>,
        tax: i64,
        ytd: i64,
        next_o_id: u32,
    }
);

row!(
    /// CUSTOMER (key: w, d, c).
    Customer {
        first: Vec<u8>,
        middle: Vec<u8>,
        last: Vec<u8>,
        street_1: Vec<u8>,
        street_2: Vec<u8>,
        city: Vec<u8>,
        state: Vec<u8>,
        zip: Vec<u8>,
        phone: Vec<u8>,
        since: u64,
        credit: Vec<u8>,
        credit_lim: i64,
        discount: i64,
        balance: i64,
        ytd_payment: i64,
        payment_cnt: u32,
        delivery_cnt: u32,
        data: Vec<u8>,
    }
);

row!(
    /// HISTORY (key: w, d, then a number unique to the writer: the table
    /// has no primary key).
    History {
        c_id: u32,
        c_d_id: u32,
        c_w_id: u32,
        d_id: u32,
        w_id: u32,
        date: u64,
        amount: i64,
        data: Vec<u8>,
    }
);

row!(
    /// ORDER (key: w, d, o).
    Order {
        c_id: u32,
        entry_d: u64,
        /// 0: null (not delivered).
        carrier_id: u32,
        ol_cnt: u32,
        all_local: u32,
    }
);

row!(
    /// ORDER-LINE (key: w, d, o, number).
    OrderLine {
        i_id: u32,
        supply_w_id: u32,
        /// 0: null (not delivered).
        delivery_d: u64,
        quantity: u32,
        amount: i64,
        dist_info: Vec<u8>,
    }
);

row!(
    /// ITEM (key: i).
    Item {
        im_id: u32,
        name: Vec<u8>,
        price: i64,
        data: Vec<u8>,
    }
);

row!(
    /// STOCK (key: w, i). `dist` holds S_DIST_01..10, 24 bytes each.
    Stock {
        quantity: i32,
        dist: Vec<u8>,
        ytd: u64,
        order_cnt: u32,
        remote_cnt: u32,
        data: Vec<u8>,
    }
);

impl Stock {
    /// S_DIST_xx for district `d` (1..=10).
    pub fn dist_of(&self, d: u32) -> Vec<u8> {
        let s = (d.clamp(1, 10) as usize - 1) * 24;
        self.dist.get(s..s + 24).unwrap_or_default().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_damage_is_an_error() {
        let c = Customer {
            first: b"Ann".to_vec(),
            last: b"BARBARABLE".to_vec(),
            balance: -1000,
            data: vec![7; 400],
            ..Customer::default()
        };
        let b = c.encode();
        assert_eq!(Customer::decode(&b).unwrap(), c);
        assert!(Customer::decode(&b[..b.len() - 1]).is_err());
        let mut longer = b.clone();
        longer.push(0);
        assert!(Customer::decode(&longer).is_err());
    }

    #[test]
    fn keys_sort_like_their_ids() {
        assert!(key(&[1, 2, 3]) < key(&[1, 2, 256]));
        assert!(key(&[1, 9]) < key(&[2, 0]));
        assert_eq!(last_id(&key(&[4, 5, 6])).unwrap(), 6);
        assert_eq!(part(&key(&[4, 5, 6]), 1).unwrap(), 5);
        let a = by_name_key(1, 1, b"ABLE", b"zed", 9);
        let b = by_name_key(1, 1, b"ABLEABLE", b"amy", 1);
        assert!(a < b);
        assert!(a.starts_with(&by_name_prefix(1, 1, b"ABLE")));
        assert!(!b.starts_with(&by_name_prefix(1, 1, b"ABLE")));
    }
}
