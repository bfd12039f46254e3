//! A hasher for the worker's maps keyed by job ids, worker ids and attempt numbers.
//!
//! The standard library's SipHash resists keys chosen to collide, at a price: hashing the
//! attempt keys of the worker's ledger (a lookup when a job is claimed, started, finished
//! and recorded) was a tenth of the instructions of a process that filled a queue with
//! 20,000 no-op jobs and drained it (callgrind, 2026-12-04; 1% with this hasher). These
//! keys are integers the database hands out, not text a client can choose, so a
//! multiply-and-mix hash does: each integer is folded into the state with a multiplication
//! by an odd 64-bit constant, and `finish` mixes the state once more so that the low bits
//! (the bucket) and the high bits (the control byte) both depend on every input bit. Even
//! ids picked to collide (a role that may insert with `OVERRIDING SYSTEM VALUE`) would only
//! slow the lookups of a map that holds at most a few thousand attempts, never change them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` hashed with [`IdHasher`].
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// See the module's documentation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

/// An odd constant with its bits spread evenly (the fractional part of the golden ratio).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The finalizer of splitmix64.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(K);
    }

    fn write_i64(&mut self, x: i64) {
        self.write_u64(x as u64);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_i32(&mut self, x: i32) {
        self.write_u64(u64::from(x as u32));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(t: &T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(t)
    }

    #[test]
    fn sequential_ids_spread_over_low_and_high_bits() {
        // Ids as the database hands them out: consecutive. Both the bucket bits (low) and
        // the control bits (high 7) must take many values, or lookups degrade to scans.
        let hashes: Vec<u64> = (1_000_000i64..1_004_096).map(|id| hash(&id)).collect();
        let low: HashSet<u64> = hashes.iter().map(|h| h & 0xfff).collect();
        let high: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 2_400, "{} of 4,096 low-bit patterns", low.len());
        assert_eq!(high.len(), 128, "every control byte value is used");
    }

    #[test]
    fn every_field_of_a_key_counts() {
        #[derive(Hash)]
        struct Key(i64, i64, i32);
        let a = hash(&Key(7, 1, 1));
        assert_ne!(a, hash(&Key(7, 1, 2)));
        assert_ne!(a, hash(&Key(7, 2, 1)));
        assert_ne!(a, hash(&Key(8, 1, 1)));
        assert_ne!(hash(&Key(1, 2, 3)), hash(&Key(2, 1, 3)), "order matters");
        assert_ne!(hash(&"ab"), hash(&"ba"));
    }

    #[test]
    fn a_map_of_many_keys_finds_each() {
        let mut m: IdMap<(i64, i32), usize> = IdMap::default();
        for i in 0..50_000usize {
            m.insert((i as i64 * 3, (i % 7) as i32), i);
        }
        for i in 0..50_000usize {
            assert_eq!(m.get(&(i as i64 * 3, (i % 7) as i32)), Some(&i));
        }
        assert_eq!(m.get(&(1, 0)), None);
    }
}
