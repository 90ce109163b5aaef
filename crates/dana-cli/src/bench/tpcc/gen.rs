//! TPC-C's random inputs (spec clause 2.1.6 and 4.3.2): uniform numbers,
//! NURand with its run-time constants, last names, strings.
//!
//! Owns: drawing every input of the load and of the five transactions.
//! Never: draws from a source that is not seeded (a run is reproducible
//! from its seed, up to the interleaving of tasks).

use crate::rng::XorShift;

/// The three NURand constants C (for A = 255, 1023 and 8191).
#[derive(Debug, Clone, Copy)]
pub struct NuRandC {
    pub c_last: u64,
    pub c_id: u64,
    pub ol_i_id: u64,
}

impl NuRandC {
    /// The load's constants from `seed`.
    pub fn load(seed: u64) -> NuRandC {
        let mut r = XorShift::new(seed);
        NuRandC {
            c_last: r.below(256),
            c_id: r.below(1024),
            ol_i_id: r.below(8192),
        }
    }

    /// The run's constants: C_LAST differs from the load's by a delta in
    /// 65..=119 other than 96 and 112 (clause 2.1.6.1); the others are
    /// drawn anew.
    pub fn run(load: NuRandC, seed: u64) -> NuRandC {
        let mut r = XorShift::new(seed ^ 0x7c_c0de);
        let c_last = loop {
            let c = r.below(256);
            let delta = c.abs_diff(load.c_last);
            if (65..=119).contains(&delta) && delta != 96 && delta != 112 {
                break c;
            }
        };
        NuRandC {
            c_last,
            c_id: r.below(1024),
            ol_i_id: r.below(8192),
        }
    }
}

/// The generator of one task.
pub struct Gen {
    rng: XorShift,
    pub c: NuRandC,
}

const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

impl Gen {
    pub fn new(seed: u64, c: NuRandC) -> Gen {
        Gen {
            rng: XorShift::new(seed),
            c,
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn uniform(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.rng.below(hi - lo + 1)
    }

    /// `uniform` as u32.
    pub fn u32_in(&mut self, lo: u32, hi: u32) -> u32 {
        self.uniform(u64::from(lo), u64::from(hi)) as u32
    }

    /// NURand(A, x, y) with this generator's C for that A.
    pub fn nurand(&mut self, a: u64, x: u64, y: u64) -> u64 {
        let c = match a {
            255 => self.c.c_last,
            1023 => self.c.c_id,
            _ => self.c.ol_i_id,
        };
        (((self.uniform(0, a) | self.uniform(x, y)) + c) % (y - x + 1)) + x
    }

    /// A customer id, NURand(1023, 1, 3000).
    pub fn customer_id(&mut self) -> u32 {
        self.nurand(1023, 1, 3000) as u32
    }

    /// An item id, NURand(8191, 1, 100000).
    pub fn item_id(&mut self) -> u32 {
        self.nurand(8191, 1, 100_000) as u32
    }

    /// A last name for the run, from NURand(255, 0, 999).
    pub fn run_last_name(&mut self) -> Vec<u8> {
        last_name(self.nurand(255, 0, 999) as u32)
    }

    /// A random alphanumeric string of `lo..=hi` characters.
    pub fn astring(&mut self, lo: usize, hi: usize) -> Vec<u8> {
        let n = self.uniform(lo as u64, hi as u64) as usize;
        (0..n)
            .map(|_| ALNUM[self.rng.below(ALNUM.len() as u64) as usize])
            .collect()
    }

    /// A random numeric string of `n` digits.
    pub fn nstring(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| b'0' + self.rng.below(10) as u8).collect()
    }

    /// Item or stock data: 26..=50 characters, 10% holding "ORIGINAL".
    pub fn data_original(&mut self) -> Vec<u8> {
        let mut d = self.astring(26, 50);
        if self.uniform(1, 10) == 1 {
            let at = self.uniform(0, (d.len() - 8) as u64) as usize;
            d[at..at + 8].copy_from_slice(b"ORIGINAL");
        }
        d
    }

    /// A zip code: 4 digits then "11111".
    pub fn zip(&mut self) -> Vec<u8> {
        let mut z = self.nstring(4);
        z.extend_from_slice(b"11111");
        z
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }
}

/// The last name of number `n` (0..=999): three syllables by its digits.
pub fn last_name(n: u32) -> Vec<u8> {
    let n = n % 1000;
    let mut s = String::with_capacity(15);
    for d in [n / 100, (n / 10) % 10, n % 10] {
        s.push_str(SYLLABLES[d as usize]);
    }
    s.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_names_follow_the_syllables() {
        assert_eq!(last_name(0), b"BARBARBAR");
        assert_eq!(last_name(371), b"PRICALLYOUGHT");
        assert_eq!(last_name(999), b"EINGEINGEING");
    }

    #[test]
    fn nurand_stays_in_range_and_run_constants_keep_the_delta() {
        let load = NuRandC::load(5);
        let run = NuRandC::run(load, 5);
        let d = run.c_last.abs_diff(load.c_last);
        assert!((65..=119).contains(&d) && d != 96 && d != 112);
        let mut g = Gen::new(1, run);
        for _ in 0..10_000 {
            assert!((1..=3000).contains(&g.customer_id()));
            assert!((1..=100_000).contains(&g.item_id()));
            assert!(g.run_last_name().len() >= 9);
        }
        let d = g.data_original();
        assert!((26..=50).contains(&d.len()));
    }
}
