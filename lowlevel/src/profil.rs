//! `PAPI_profil` and `PAPI_sprofil`: SVR4 `profil(2)`-style histograms of
//! the sampled instruction address.
//!
//! # Scale
//!
//! As in PAPI, the bucket of address `pc` in a region starting at `offset`
//! with scale `s` is `((pc - offset) * s) >> 17`: `s` is a 16-bit fixed-point
//! fraction of one bucket per two bytes of text. 65536 (0x10000) gives one
//! bucket per 2 bytes, 32768 one per 4 bytes, 131072 (0x20000) one per byte,
//! whatever the bucket width; the bucket width only decides the counter
//! size. The special case `offset == 0 && scale == 2` puts every sample in
//! bucket 0. Accepted scales: 2..=131072.
//!
//! # Flags
//!
//! - `POSIX` (0): add 1 per sample.
//! - `RANDOM`: drop about a quarter of the samples at random (a fixed LCG).
//! - `WEIGHTED`: add 1..=255 scaled by how far the sample's period exceeded
//!   the threshold, as PAPI does with its excess; perf samples with exactly
//!   the threshold, so this adds 1 unless the kernel reports a longer period.
//! - `COMPRESS`: skip a sample with probability bucket/65536, so hot
//!   buckets grow more slowly.
//! - `BUCKET_16` (default when none is given), `BUCKET_32`, `BUCKET_64`:
//!   counter width. Buckets saturate instead of wrapping as PAPI's do.
//! - `FORCE_SW`, `DATA_EAR`, `INST_EAR` are refused: there is no polling
//!   overflow, and the EAR modes were Itanium's.
//!
//! # Differences from PAPI
//!
//! The buckets live in the [`Profile`] (atomics the signal handler
//! increments), not in a caller's array: read them with
//! [`Profile::buckets`]. `sprofil` picks the region with the highest offset
//! at or below the address (PAPI requires strictly below, which sends a
//! sample at a region's first byte to the previous region); samples in no
//! region are counted in [`Profile::outside`] instead of being dropped
//! unseen.

use std::ops::Range;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use crate::error::{Error, Result, SetOp};

/// `PAPI_PROFIL_*` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProfilFlags(pub u32);

impl ProfilFlags {
    /// One count per sample.
    pub const POSIX: ProfilFlags = ProfilFlags(0);
    /// Drop about 25 % of the samples.
    pub const RANDOM: ProfilFlags = ProfilFlags(1);
    /// Weight by the sample's excess over the threshold.
    pub const WEIGHTED: ProfilFlags = ProfilFlags(2);
    /// Slow down the growth of big buckets.
    pub const COMPRESS: ProfilFlags = ProfilFlags(4);
    /// 16-bit buckets (the default).
    pub const BUCKET_16: ProfilFlags = ProfilFlags(8);
    /// 32-bit buckets.
    pub const BUCKET_32: ProfilFlags = ProfilFlags(0x10);
    /// 64-bit buckets.
    pub const BUCKET_64: ProfilFlags = ProfilFlags(0x20);
    /// Software overflow (refused).
    pub const FORCE_SW: ProfilFlags = ProfilFlags(0x40);
    /// Data EAR (refused).
    pub const DATA_EAR: ProfilFlags = ProfilFlags(0x80);
    /// Instruction EAR (refused).
    pub const INST_EAR: ProfilFlags = ProfilFlags(0x100);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: ProfilFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for ProfilFlags {
    type Output = ProfilFlags;
    fn bitor(self, rhs: ProfilFlags) -> ProfilFlags {
        ProfilFlags(self.0 | rhs.0)
    }
}

/// One profiled address range (`PAPI_sprofil_t` without the buffer pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Number of buckets (PAPI's `pr_size` divided by the bucket width).
    pub buckets: usize,
    /// Lowest address profiled (`pr_off`).
    pub offset: u64,
    /// Fixed-point scale (`pr_scale`), see the module docs.
    pub scale: u32,
}

impl Region {
    /// A region with one bucket per `bytes_per_bucket` bytes (a power of two
    /// from 1 to 65536) covering `range`.
    pub fn covering(range: Range<u64>, bytes_per_bucket: u64) -> Result<Region> {
        if !bytes_per_bucket.is_power_of_two() || bytes_per_bucket > 65536 {
            return Err(Error::Invalid {
                what: "profil bucket size",
                reason: format!("{bytes_per_bucket} bytes: use a power of two from 1 to 65536"),
            });
        }
        let len = range.end.saturating_sub(range.start);
        Ok(Region {
            buckets: len.div_ceil(bytes_per_bucket) as usize,
            offset: range.start,
            scale: (131072 / bytes_per_bucket) as u32,
        })
    }

    /// The bucket `pc` falls in, if inside the region.
    pub fn bucket_of(&self, pc: u64) -> Option<usize> {
        if pc < self.offset {
            return None;
        }
        let idx = if self.offset == 0 && self.scale == 2 {
            0
        } else {
            ((u128::from(pc - self.offset) * u128::from(self.scale)) >> 17) as u64
        };
        usize::try_from(idx).ok().filter(|&i| i < self.buckets)
    }

    /// The addresses bucket `i` covers.
    pub fn bucket_range(&self, i: usize) -> Range<u64> {
        let step = |k: u64| ((u128::from(k) << 17).div_ceil(u128::from(self.scale.max(1)))) as u64;
        self.offset + step(i as u64)..self.offset + step(i as u64 + 1)
    }
}

enum Buckets {
    B16(Box<[AtomicU16]>),
    B32(Box<[AtomicU32]>),
    B64(Box<[AtomicU64]>),
}

impl Buckets {
    fn get(&self, i: usize) -> u64 {
        match self {
            Buckets::B16(b) => u64::from(b[i].load(Ordering::Relaxed)),
            Buckets::B32(b) => u64::from(b[i].load(Ordering::Relaxed)),
            Buckets::B64(b) => b[i].load(Ordering::Relaxed),
        }
    }
    fn add(&self, i: usize, n: u64) {
        // ATOMICS: Relaxed: buckets are independent counters read after the fact.
        match self {
            Buckets::B16(b) => {
                let _ = b[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_add(u16::try_from(n).unwrap_or(u16::MAX)))
                });
            }
            Buckets::B32(b) => {
                let _ = b[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_add(u32::try_from(n).unwrap_or(u32::MAX)))
                });
            }
            Buckets::B64(b) => {
                let _ =
                    b[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_add(n)));
            }
        }
    }
}

/// A histogram being filled by an overflowing event.
pub struct Profile {
    regions: Vec<(Region, Buckets)>,
    flags: ProfilFlags,
    threshold: u64,
    rng: AtomicU32,
    samples: AtomicU64,
    outside: AtomicU64,
    skipped: AtomicU64,
}

impl std::fmt::Debug for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profile")
            .field("regions", &self.regions.iter().map(|r| r.0).collect::<Vec<_>>())
            .field("flags", &self.flags)
            .field("samples", &self.samples())
            .field("outside", &self.outside())
            .finish()
    }
}

impl Profile {
    /// A profile over `regions` for samples every `threshold` events.
    pub fn new(regions: Vec<Region>, flags: ProfilFlags, threshold: u64) -> Result<Profile> {
        let refuse = |what: &str| {
            Err(Error::NotSupported {
                op: SetOp::SetOption,
                reason: format!("PAPI_PROFIL_{what} has no perf_event equivalent"),
            })
        };
        if flags.contains(ProfilFlags::FORCE_SW) {
            return refuse("FORCE_SW (software overflow)");
        }
        if flags.contains(ProfilFlags::DATA_EAR) || flags.contains(ProfilFlags::INST_EAR) {
            return refuse("DATA_EAR/INST_EAR (Itanium event address registers)");
        }
        let widths = [ProfilFlags::BUCKET_16, ProfilFlags::BUCKET_32, ProfilFlags::BUCKET_64];
        if widths.iter().filter(|w| flags.contains(**w)).count() > 1 {
            return Err(Error::Invalid {
                what: "profil flags",
                reason: "more than one PAPI_PROFIL_BUCKET_* size".into(),
            });
        }
        let known = 0x1ff;
        if flags.0 & !known != 0 {
            return Err(Error::Invalid {
                what: "profil flags",
                reason: format!("unknown bits {:#x}", flags.0 & !known),
            });
        }
        if regions.is_empty() {
            return Err(Error::Invalid { what: "profil regions", reason: "give at least one region".into() });
        }
        let mut out = Vec::with_capacity(regions.len());
        for r in regions {
            if !(2..=131072).contains(&r.scale) || r.buckets == 0 {
                return Err(Error::Invalid {
                    what: "profil region",
                    reason: format!(
                        "scale {} with {} buckets: the scale must be 2..=131072 (65536 = one bucket per 2 bytes) and the buffer non-empty",
                        r.scale, r.buckets
                    ),
                });
            }
            let b = if flags.contains(ProfilFlags::BUCKET_64) {
                Buckets::B64((0..r.buckets).map(|_| AtomicU64::new(0)).collect())
            } else if flags.contains(ProfilFlags::BUCKET_32) {
                Buckets::B32((0..r.buckets).map(|_| AtomicU32::new(0)).collect())
            } else {
                Buckets::B16((0..r.buckets).map(|_| AtomicU16::new(0)).collect())
            };
            out.push((r, b));
        }
        Ok(Profile {
            regions: out,
            flags,
            threshold,
            rng: AtomicU32::new(0xdead_beef),
            samples: AtomicU64::new(0),
            outside: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        })
    }

    fn random(&self) -> u16 {
        // ATOMICS: Relaxed; only the sequence's values matter, not ordering.
        let next = |x: u32| x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let prev =
            self.rng.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(next(x))).unwrap_or(0);
        next(prev) as u16
    }

    /// Records one sample at `pc` whose period was `period`. Signal-safe.
    pub fn record(&self, pc: u64, period: u64) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        let region = self
            .regions
            .iter()
            .enumerate()
            .filter(|(_, (r, _))| r.offset <= pc)
            .max_by_key(|(_, (r, _))| r.offset)
            .map(|(i, _)| i)
            .unwrap_or(0);
        let (r, b) = &self.regions[region];
        let Some(i) = r.bucket_of(pc) else {
            self.outside.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let inc = self.increment(b.get(i), period);
        if inc == 0 {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        } else {
            b.add(i, inc);
        }
    }

    fn increment(&self, value: u64, period: u64) -> u64 {
        let f = self.flags;
        if f.contains(ProfilFlags::RANDOM) && self.random() <= u16::MAX / 4 {
            return 0;
        }
        if f.contains(ProfilFlags::COMPRESS) && u64::from(self.random()) < value {
            return 0;
        }
        if f.contains(ProfilFlags::WEIGHTED) {
            let excess = period.saturating_sub(self.threshold);
            return if excess <= 1 {
                1
            } else if excess > self.threshold {
                255
            } else {
                (excess / (self.threshold / 255).max(1)).clamp(1, 255)
            };
        }
        1
    }

    /// The regions, in the order given.
    pub fn regions(&self) -> impl Iterator<Item = &Region> {
        self.regions.iter().map(|(r, _)| r)
    }

    /// The bucket values of region `i`.
    pub fn buckets(&self, i: usize) -> Option<Vec<u64>> {
        let (r, b) = self.regions.get(i)?;
        Some((0..r.buckets).map(|k| b.get(k)).collect())
    }

    /// Samples recorded (in a bucket, outside, or skipped by RANDOM/COMPRESS).
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }
    /// Samples whose address was in no region.
    pub fn outside(&self) -> u64 {
        self.outside.load(Ordering::Relaxed)
    }
    /// Samples RANDOM or COMPRESS chose not to count.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(buckets: usize, offset: u64, scale: u32) -> Region {
        Region { buckets, offset, scale }
    }

    #[test]
    fn scale_65536_is_one_bucket_per_two_bytes_for_every_width() {
        for w in [ProfilFlags::BUCKET_16, ProfilFlags::BUCKET_32, ProfilFlags::BUCKET_64] {
            let p = Profile::new(vec![region(8, 0x1000, 65536)], w, 100).unwrap();
            for pc in 0x1000..0x1010 {
                p.record(pc, 100);
            }
            assert_eq!(p.buckets(0).unwrap(), vec![2; 8]);
            assert_eq!(p.outside(), 0);
        }
    }

    #[test]
    fn other_scales_and_the_zero_offset_special_case() {
        let r = region(4, 0x1000, 131072);
        assert_eq!(
            (0..4).map(|i| r.bucket_of(0x1000 + i)).collect::<Vec<_>>(),
            vec![Some(0), Some(1), Some(2), Some(3)]
        );
        assert_eq!(r.bucket_of(0x1004), None);
        assert_eq!(r.bucket_of(0xfff), None);
        let quarter = region(4, 0, 32768);
        assert_eq!(quarter.bucket_of(7), Some(1));
        assert_eq!(region(1, 0, 2).bucket_of(0xdead_beef), Some(0), "offset 0, scale 2: all in bucket 0");
        let c = Region::covering(0x2000..0x2100, 16).unwrap();
        assert_eq!((c.buckets, c.scale), (16, 8192));
        assert_eq!(c.bucket_of(0x20ff), Some(15));
        assert_eq!(c.bucket_range(1), 0x2010..0x2020);
    }

    #[test]
    fn sprofil_picks_the_closest_region_below_and_counts_misses() {
        let p =
            Profile::new(vec![region(4, 0x1000, 65536), region(4, 0x2000, 65536)], ProfilFlags::BUCKET_32, 1)
                .unwrap();
        p.record(0x2000, 1);
        p.record(0x1002, 1);
        p.record(0x1800, 1);
        p.record(0x10, 1);
        assert_eq!(p.buckets(0).unwrap(), vec![0, 1, 0, 0]);
        assert_eq!(p.buckets(1).unwrap(), vec![1, 0, 0, 0]);
        assert_eq!((p.samples(), p.outside()), (4, 2));
    }

    #[test]
    fn random_drops_about_a_quarter_and_compress_slows_hot_buckets() {
        let p = Profile::new(vec![region(1, 0, 2)], ProfilFlags::RANDOM | ProfilFlags::BUCKET_64, 1).unwrap();
        for _ in 0..100_000 {
            p.record(5, 1);
        }
        let kept = p.buckets(0).unwrap()[0];
        assert!((72_000..78_000).contains(&kept), "{kept}");
        assert_eq!(kept + p.skipped(), 100_000);
        let c =
            Profile::new(vec![region(1, 0, 2)], ProfilFlags::COMPRESS | ProfilFlags::BUCKET_64, 1).unwrap();
        for _ in 0..200_000 {
            c.record(5, 1);
        }
        let v = c.buckets(0).unwrap()[0];
        assert!(v < 200_000 && c.skipped() > 0, "{v}");
    }

    #[test]
    fn weighted_and_saturation() {
        let p = Profile::new(vec![region(1, 0, 2)], ProfilFlags::WEIGHTED | ProfilFlags::BUCKET_16, 1000)
            .unwrap();
        p.record(1, 1000);
        assert_eq!(p.buckets(0).unwrap()[0], 1, "exact period: weight 1");
        p.record(1, 1500);
        assert_eq!(p.buckets(0).unwrap()[0], 1 + 500 / 3);
        p.record(1, 5000);
        assert_eq!(p.buckets(0).unwrap()[0], 1 + 166 + 255);
        let s = Profile::new(vec![region(1, 0, 2)], ProfilFlags::POSIX, 1).unwrap();
        for _ in 0..70_000 {
            s.record(0, 1);
        }
        assert_eq!(s.buckets(0).unwrap()[0], u64::from(u16::MAX), "16-bit buckets saturate");
    }

    #[test]
    fn bad_arguments_are_refused() {
        let r = vec![region(1, 0, 65536)];
        for f in [ProfilFlags::FORCE_SW, ProfilFlags::DATA_EAR, ProfilFlags::INST_EAR] {
            assert!(matches!(Profile::new(r.clone(), f, 1), Err(Error::NotSupported { .. })));
        }
        assert!(Profile::new(r.clone(), ProfilFlags::BUCKET_16 | ProfilFlags::BUCKET_64, 1).is_err());
        assert!(Profile::new(r, ProfilFlags(0x1000), 1).is_err());
        assert!(Profile::new(vec![region(1, 0, 1)], ProfilFlags::POSIX, 1).is_err());
        assert!(Profile::new(vec![region(1, 0, 131073)], ProfilFlags::POSIX, 1).is_err());
        assert!(Profile::new(vec![], ProfilFlags::POSIX, 1).is_err());
        assert!(Region::covering(0..10, 3).is_err());
    }
}
