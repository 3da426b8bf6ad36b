//! Whether, and how hard, a sending connection compresses its next block: decided from what
//! its own last blocks measured, with no I/O here.
//!
//! Two rates decide: how fast this connection's path delivers bytes (the kernel's delivery
//! rate, `w`, bytes on the wire a second), and how fast zstd compresses at each level here
//! (`c`, bytes of the file a second, on this connection's thread, with whatever else the CPU
//! runs), with the share of the wire each level's output takes (`r`). Compressing at a level
//! moves `min(c, w / r)` bytes of the file a second, plain moves `w`: the choice is the level
//! that moves the most, with margins so that it does not flap. `auto` may choose plain; `on`
//! always compresses, at the level the same rule picks. Data that does not shrink goes plain.

use braid_proto::compress::Policy;

/// zstd levels to climb through: each roughly halves the speed of the one before for a few
/// per cent less on the wire, which pays only on slow paths. 16 rather than 15: on logs in
/// 4 MiB blocks 15 saves 1 % over 12 at a fifth of its speed, 16 (zstd's first `btultra`
/// level) 7 % at a seventh. Not 19: 1 % more than 16 at half its speed, so that a path
/// measured low early (slow start) climbed to it and then waited for it.
pub const LEVELS: [i32; 6] = [1, 3, 6, 9, 12, 16];

/// How many times slower each of [`LEVELS`] compresses than the one below it (zstd -b on web
/// logs, 2 cores here): the guess for a level not yet measured.
const SLOWER: [f64; 6] = [1.0, 2.0, 2.5, 2.0, 2.0, 7.0];

/// Bytes of a block compressed to probe it while sending plain.
pub const PROBE: usize = 64 << 10;

/// Compressing must move this much more than plain before `auto` starts it, and stops once it
/// moves less than [`KEEP`] times plain.
const START: f64 = 1.25;
const KEEP: f64 = 1.1;

/// The next level is tried only if it is expected to compress this much faster than the path
/// needs (it is about half as fast as the one below until measured).
const CLIMB: f64 = 1.2;

/// Data whose output takes more than this share of its input is not worth compressing.
const SHRINKS: f64 = 0.9;

/// Blocks at one level before the next change, so that each is judged on its own blocks.
const SETTLE: u32 = 3;

/// Plain blocks between probes at first; doubled after each probe that says no, up to
/// [`MOST_BETWEEN`], so that a file that never compresses pays almost nothing.
const FIRST_BETWEEN: u32 = 8;
const MOST_BETWEEN: u32 = 512;

/// The path's rate is the highest of this many latest samples: the kernel's samples run low
/// while the sender has nothing to send, never high.
const PATH_SAMPLES: usize = 16;

/// What to do with the next block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Choice {
    Plain,
    /// Compress a [`PROBE`] sample of it at this level, then send it plain.
    Probe(i32),
    Compress(i32),
}

/// What a block cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sent {
    Plain,
    /// A sample of `raw` bytes at `level` compressed to `wire` in `compress` seconds.
    Probed {
        level: i32,
        raw: u64,
        wire: u64,
        compress: f64,
    },
    /// Compressed at `level` (`wire == raw` when it did not shrink and went plain).
    Compressed {
        level: i32,
        raw: u64,
        wire: u64,
        compress: f64,
    },
}

/// A mean that follows the last few megabytes' samples.
#[derive(Debug, Clone, Copy, Default)]
struct Ewma(Option<f64>);

impl Ewma {
    /// A sample from `bytes` of data: a 64 KiB probe moves the mean a sixteenth as far as a
    /// 1 MiB block, since zstd's high levels run twice as fast on the one as on 4 MiB.
    fn add(&mut self, x: f64, bytes: u64) {
        let weight = 0.3 * (bytes as f64 / f64::from(1 << 20)).min(1.0);
        self.0 = Some(self.0.map_or(x, |m| (1.0 - weight) * m + weight * x));
    }
}

/// One sending connection's choice.
#[derive(Debug, Clone)]
pub struct Governor {
    policy: Policy,
    /// Index into [`LEVELS`] while compressing; None while sending plain.
    level: Option<usize>,
    /// Per level: bytes of the file compressed a second, and the share of the wire.
    speed: [Ewma; LEVELS.len()],
    ratio: [Ewma; LEVELS.len()],
    /// The latest delivery-rate samples, bytes a second, oldest first.
    path: Vec<f64>,
    /// Blocks since the level last changed, or since the last probe.
    blocks: u32,
    between: u32,
    /// The highest level whose zstd context fits in the process's memory for them, as an
    /// index (None: not even the lowest).
    top: Option<usize>,
}

impl Governor {
    /// A connection starts compressing at the lowest level (under `auto` too: until the path
    /// has been measured, a block that shrinks is worth the millisecond it costs, and its
    /// first block tells how well the data shrinks).
    pub fn new(policy: Policy) -> Governor {
        Governor {
            policy,
            level: (policy != Policy::Off).then_some(0),
            speed: Default::default(),
            ratio: Default::default(),
            path: Vec::with_capacity(PATH_SAMPLES),
            // The first level was chosen without the path: one block judges it, and the
            // climb follows the path's first measurement at once.
            blocks: SETTLE - 1,
            between: FIRST_BETWEEN,
            top: Some(LEVELS.len() - 1),
        }
    }

    /// The highest level (index) whose context fits in memory now: a connection above it
    /// comes down to it at once, or goes plain when none fits, and climbs no higher.
    pub fn fits(&mut self, top: Option<usize>) {
        self.top = top;
        match (self.level, top) {
            (Some(i), Some(t)) if i > t => self.go(t),
            (Some(_), None) => {
                self.level = None;
                self.blocks = 0;
            }
            _ => {}
        }
    }

    pub fn choose(&self) -> Choice {
        match (self.policy, self.level) {
            (Policy::Off, _) => Choice::Plain,
            (_, Some(i)) => Choice::Compress(LEVELS[i]),
            (_, None) if self.blocks >= self.between => Choice::Probe(LEVELS[0]),
            (_, None) => Choice::Plain,
        }
    }

    /// The share of a block's bytes the wire carries now (for what the socket may queue).
    pub fn wire_share(&self) -> f64 {
        match self.level {
            Some(i) => self.ratio[i].0.unwrap_or(1.0).clamp(0.01, 1.0),
            None => 1.0,
        }
    }

    /// A sample of the rate this connection's path delivers, bytes a second (0: none yet).
    pub fn path(&mut self, delivered: f64) {
        if delivered > 0.0 {
            if self.path.len() == PATH_SAMPLES {
                self.path.remove(0);
            }
            self.path.push(delivered);
            self.decide();
        }
    }

    /// Whether the path has been measured: until then blocks are kept small (the first
    /// acknowledgements come a round trip after the first block).
    pub fn measured(&self) -> bool {
        !self.path.is_empty()
    }

    fn path_rate(&self) -> Option<f64> {
        self.path.iter().copied().reduce(f64::max)
    }

    pub fn sent(&mut self, s: Sent) {
        self.blocks += 1;
        match s {
            Sent::Plain => {}
            Sent::Probed {
                level,
                raw,
                wire,
                compress,
            } => {
                // A probe speaks for the data as it is now, not averaged with the past.
                if let Some(i) = LEVELS.iter().position(|&l| l == level) {
                    self.ratio[i] = Ewma::default();
                }
                self.learn(level, raw, wire, compress);
                self.blocks = 0;
                self.between = (self.between * 2).min(MOST_BETWEEN);
            }
            Sent::Compressed {
                level,
                raw,
                wire,
                compress,
            } => self.learn(level, raw, wire, compress),
        }
        self.decide();
    }

    fn learn(&mut self, level: i32, raw: u64, wire: u64, compress: f64) {
        let Some(i) = LEVELS.iter().position(|&l| l == level) else {
            return;
        };
        if raw > 0 {
            self.speed[i].add(raw as f64 / compress.max(1e-9), raw);
            self.ratio[i].add(wire as f64 / raw as f64, raw);
        }
    }

    /// Bytes of the file a second at level `i` on a path of `w`, if level `i` was measured.
    fn moves(&self, i: usize, w: f64) -> Option<f64> {
        let (c, r) = (self.speed[i].0?, self.ratio[i].0?);
        Some(c.min(w / r.max(1e-3)))
    }

    fn decide(&mut self) {
        let auto = self.policy == Policy::Auto;
        let Some(w) = self.path_rate() else {
            // Not measured yet: data that does not shrink stops being tried, nothing else.
            if auto && self.ratio[0].0.is_some_and(|r| r > SHRINKS) {
                self.stop();
            }
            return;
        };
        let Some(i) = self.level else {
            if self.top.is_some()
                && self.moves(0, w).is_some_and(|m| m > START * w)
                && self.ratio[0].0.is_some_and(|r| r <= SHRINKS)
            {
                self.go(0);
            }
            return;
        };
        let (Some(c), Some(r)) = (self.speed[i].0, self.ratio[i].0) else {
            return;
        };
        let moves = c.min(w / r.max(1e-3));
        // Down at once when this level does worse; up only after it has settled.
        if auto && r > SHRINKS {
            self.stop();
        } else if auto && moves < KEEP * w {
            match i {
                0 => self.stop(),
                _ => self.go(i - 1),
            }
        } else if c < w / r && i > 0 {
            // The compressor holds the path back: the level below keeps up better.
            self.go(i - 1);
        } else if self.blocks >= SETTLE
            && let Some(j) = self.highest_fast_enough(i, w)
        {
            self.go(j);
        }
    }

    /// The highest level above `i` expected to compress [`CLIMB`] times faster than the path
    /// needs: as measured where a level was, else [`SLOWER`] than the level below. Up in one
    /// step, not one level at a time: climbing from 1 to 16 a level per settled stretch took
    /// a third of a 20 MB file on a T1, at the lower levels' ratios.
    fn highest_fast_enough(&self, i: usize, w: f64) -> Option<usize> {
        let (mut speed, mut ratio) = (self.speed[i].0?, self.ratio[i].0?);
        let mut best = None;
        let top = self.top.unwrap_or(0);
        for (j, slower) in SLOWER.iter().enumerate().take(top + 1).skip(i + 1) {
            speed = self.speed[j].0.unwrap_or(speed / slower);
            ratio = self.ratio[j].0.unwrap_or(ratio);
            if speed <= CLIMB * w / ratio.max(1e-3) {
                break;
            }
            best = Some(j);
        }
        best
    }

    /// Bytes of the file the current level compresses while `queued` bytes leave at
    /// `sending` bytes a second (the kernel's pace for the connection), or at the path's rate
    /// if that is faster: the delivery rate runs low in slow start, when the kernel already
    /// sends faster, and waiting for zstd then idles the path.
    pub fn compressible_while(&self, queued: u64, sending: f64) -> Option<u64> {
        let speed = self.speed[self.level?].0?;
        let drain = self.path_rate()?.max(sending);
        Some((speed * queued as f64 / drain) as u64)
    }

    /// Whether the level has stayed put for [`SETTLE`] blocks and would not climb: a
    /// connection then takes blocks as large as compression allows, for the better ratio.
    pub fn settled(&self) -> bool {
        self.level.is_some() && self.blocks >= SETTLE
    }

    fn go(&mut self, level: usize) {
        self.level = Some(level);
        self.blocks = 0;
    }

    /// Back to plain. What the levels' output took of the wire is forgotten: the data may
    /// have changed, and the next probe says how it shrinks now.
    fn stop(&mut self) {
        self.level = None;
        self.blocks = 0;
        self.between = FIRST_BETWEEN;
        self.ratio = Default::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `blocks` blocks of 1 MiB through a governor on a path that delivers `path` bytes
    /// a second, with data that compresses to `ratio` at `speed(level)` bytes a second.
    fn run(
        policy: Policy,
        path: f64,
        ratio: f64,
        speed: impl Fn(i32) -> f64,
        blocks: u32,
    ) -> Governor {
        let mut g = Governor::new(policy);
        for _ in 0..blocks {
            step(&mut g, path, ratio, &speed);
        }
        g
    }

    fn step(g: &mut Governor, path: f64, ratio: f64, speed: &impl Fn(i32) -> f64) {
        let raw = 1u64 << 20;
        let s = match g.choose() {
            Choice::Plain => Sent::Plain,
            Choice::Probe(level) => Sent::Probed {
                level,
                raw: PROBE as u64,
                wire: (PROBE as f64 * ratio) as u64,
                compress: PROBE as f64 / speed(level),
            },
            Choice::Compress(level) => Sent::Compressed {
                level,
                raw,
                wire: (raw as f64 * ratio.min(1.0)) as u64,
                compress: raw as f64 / speed(level),
            },
        };
        g.sent(s);
        g.path(path);
    }

    /// zstd on web logs here, bytes a second: level 12 at 12 MB/s, 16 at 1.5.
    fn logs_speed(level: i32) -> f64 {
        match level {
            1 => 300e6,
            3 => 150e6,
            6 => 60e6,
            9 => 30e6,
            12 => 12e6,
            _ => 1.5e6,
        }
    }

    /// zstd on text here: about 500 MB/s at level 1, halving per level.
    fn zstd_speed(level: i32) -> f64 {
        let i = LEVELS.iter().position(|&l| l == level).unwrap_or(0);
        500e6 / f64::from(1 << i)
    }

    fn level(g: &Governor) -> Option<i32> {
        match g.choose() {
            Choice::Compress(l) => Some(l),
            _ => None,
        }
    }

    #[test]
    fn a_slow_path_and_text_compress_and_climb_to_the_highest_level() {
        // A T1 shared by four connections (47 kB/s each).
        let g = run(Policy::Auto, 47e3, 0.2, zstd_speed, 40);
        assert_eq!(level(&g), Some(16), "{g:?}");
    }

    /// The levels a governor compresses at over 30 blocks on a T1 (168 kB/s) of logs at 0.18
    /// of their size (0.93 MB/s of file to keep up with), each once in the order used.
    fn climb_on_a_t1(speed: impl Fn(i32) -> f64) -> (Governor, Vec<i32>) {
        let mut g = Governor::new(Policy::Auto);
        let mut seen = Vec::new();
        for _ in 0..30 {
            if let Some(l) = level(&g)
                && seen.last() != Some(&l)
            {
                seen.push(l);
            }
            step(&mut g, 168e3, 0.18, &speed);
        }
        (g, seen)
    }

    #[test]
    fn the_climb_goes_up_in_one_step_and_comes_down_to_the_level_that_keeps_up() {
        let (g, seen) = climb_on_a_t1(logs_speed);
        assert_eq!(seen, [1, 16], "{g:?}");
        assert!(g.settled(), "{g:?}");
        // Had 16 been slower than guessed, a block there says so and the level below stays.
        let (g, seen) = climb_on_a_t1(|level| {
            if level == 16 {
                0.5e6
            } else {
                logs_speed(level)
            }
        });
        assert_eq!(seen, [1, 16, 12], "{g:?}");
    }

    #[test]
    fn a_block_is_no_larger_than_zstd_compresses_while_the_kernel_sends_what_it_holds() {
        let g = run(Policy::Auto, 168e3, 0.18, logs_speed, 10);
        assert_eq!(level(&g), Some(16));
        // 336 kB queued leave in 2 s at the path's rate: 3 MB compressed meanwhile.
        assert_eq!(g.compressible_while(336_000, 0.0), Some(3_000_000));
        // A kernel pacing faster (slow start) empties it sooner.
        assert_eq!(g.compressible_while(336_000, 336e3), Some(1_500_000));
        assert_eq!(
            Governor::new(Policy::Auto).compressible_while(336_000, 0.0),
            None
        );
    }

    #[test]
    fn a_level_is_not_settled_until_it_has_stayed_for_a_few_blocks() {
        let mut g = Governor::new(Policy::Auto);
        assert!(!g.settled(), "nothing sent yet");
        step(&mut g, 3e9, 0.2, &zstd_speed);
        // Loopback: back to plain, which is never settled.
        assert_eq!(level(&g), None);
        assert!(!g.settled());
    }

    #[test]
    fn loopback_stops_after_the_first_blocks_and_probes_ever_more_rarely() {
        // 3 GB/s delivers faster than any level compresses.
        let mut g = Governor::new(Policy::Auto);
        let mut compressed = 0;
        let mut probes = 0;
        for _ in 0..2000 {
            match g.choose() {
                Choice::Compress(_) => compressed += 1,
                Choice::Probe(_) => probes += 1,
                Choice::Plain => {}
            }
            step(&mut g, 3e9, 0.2, &zstd_speed);
        }
        assert!(compressed <= 1, "{compressed} blocks compressed");
        assert!(probes <= 10, "{probes} probes in 2000 blocks");
    }

    #[test]
    fn random_data_stays_plain_even_on_a_slow_path() {
        let g = run(Policy::Auto, 47e3, 1.0, zstd_speed, 100);
        assert_eq!(g.choose(), Choice::Plain);
        // Nor does a path not yet measured keep it compressing.
        let mut g = Governor::new(Policy::Auto);
        g.sent(Sent::Compressed {
            level: 1,
            raw: 1 << 20,
            wire: 1 << 20,
            compress: 1e-3,
        });
        assert_eq!(g.choose(), Choice::Plain);
    }

    #[test]
    fn a_fast_path_settles_on_a_level_that_keeps_ahead_of_it() {
        // 15 MB/s per connection (lfn-500m over four), text at 0.2: 75 MB/s of file needed.
        let g = run(Policy::Auto, 15e6, 0.2, zstd_speed, 200);
        // Level 3 compresses at 250 MB/s, 6 at 125 (above 1.2 x 75), 9 at 62: too slow.
        assert_eq!(level(&g), Some(6), "{g:?}");
    }

    #[test]
    fn compression_slower_than_the_path_stops_in_auto_and_drops_to_level_1_when_on() {
        // A 1 GB/s path, data that compresses well but at 100 MB/s at best.
        let slow = |level: i32| zstd_speed(level) / 5.0;
        let g = run(Policy::Auto, 1e9, 0.3, slow, 100);
        assert_eq!(level(&g), None);
        let g = run(Policy::On, 1e9, 0.3, slow, 100);
        assert_eq!(level(&g), Some(1));
        assert_eq!(Governor::new(Policy::Off).choose(), Choice::Plain);
    }

    #[test]
    fn data_that_stops_shrinking_switches_auto_back_to_plain_and_a_probe_brings_it_back() {
        let mut g = run(Policy::Auto, 47e3, 0.2, zstd_speed, 20);
        assert!(level(&g).is_some());
        for _ in 0..20 {
            step(&mut g, 47e3, 1.0, &zstd_speed);
        }
        assert_eq!(level(&g), None);
        for _ in 0..40 {
            step(&mut g, 47e3, 0.2, &zstd_speed);
        }
        assert!(level(&g).is_some(), "{g:?}");
    }

    #[test]
    fn a_connection_climbs_no_higher_than_memory_allows_and_goes_plain_without_any() {
        // The T1 that takes a connection to 16, with room only up to level 9.
        let mut g = Governor::new(Policy::Auto);
        for _ in 0..30 {
            g.fits(Some(3));
            step(&mut g, 47e3, 0.2, &zstd_speed);
        }
        assert_eq!(level(&g), Some(9), "{g:?}");
        // Room for no context at all: plain at once, and it does not start again.
        for _ in 0..30 {
            g.fits(None);
            assert_eq!(level(&g), None, "{g:?}");
            step(&mut g, 47e3, 0.2, &zstd_speed);
        }
        // Room again: it climbs to the top.
        for _ in 0..60 {
            g.fits(Some(LEVELS.len() - 1));
            step(&mut g, 47e3, 0.2, &zstd_speed);
        }
        assert_eq!(level(&g), Some(16), "{g:?}");
        // Others took memory: down at once.
        g.fits(Some(1));
        assert_eq!(level(&g), Some(3));
    }
}
