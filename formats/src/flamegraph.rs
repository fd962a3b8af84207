//! Flame graph SVG, drawn by the `inferno` crate from folded stacks.

use std::io::{self, Write};

/// What the picture says about itself.
#[derive(Clone, Debug)]
pub struct Options {
    /// The title over the graph.
    pub title: String,
    /// A line under the title (the command, the event), if any.
    pub subtitle: Option<String>,
    /// What a weight counts, shown in each frame's tooltip ("samples", "ns").
    pub count_name: String,
    /// Draw an icicle graph (roots at the top) instead of flames.
    pub inverted: bool,
    /// Frames narrower than this many pixels are left out (inferno's 0.01
    /// by default; 0 draws every frame, however narrow).
    pub min_width: f64,
}

impl Default for Options {
    /// "Flame Graph", no subtitle, weights counted as samples, flames
    /// upward, frames under 0.01 pixels left out.
    fn default() -> Self {
        Options {
            title: "Flame Graph".into(),
            subtitle: None,
            count_name: "samples".into(),
            inverted: false,
            min_width: 0.01,
        }
    }
}

fn inferno_options(options: &Options) -> inferno::flamegraph::Options<'static> {
    let mut opt = inferno::flamegraph::Options::default();
    opt.title = options.title.clone();
    opt.subtitle = options.subtitle.clone();
    opt.count_name = options.count_name.clone();
    opt.min_width = options.min_width;
    // The same input draws the same picture (golden files, diffs).
    opt.deterministic = true;
    opt.hash = true;
    if options.inverted {
        opt.direction = inferno::flamegraph::Direction::Inverted;
    }
    opt
}

/// Draws `stacks` (frames root first, weight) as a flame graph SVG into
/// `out`. An input without any non-zero weight is an error
/// ([`io::ErrorKind::InvalidInput`]): there is nothing to draw.
pub fn write_svg<W, I, S, F>(out: W, stacks: I, options: &Options) -> io::Result<()>
where
    W: Write,
    I: IntoIterator<Item = (S, u64)>,
    S: IntoIterator<Item = F>,
    F: AsRef<str>,
{
    let lines: Vec<String> =
        crate::folded::lines(stacks).into_iter().map(|(l, w)| format!("{l} {w}")).collect();
    if lines.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no stacks with a weight: nothing to draw"));
    }
    draw(&mut inferno_options(options), &lines, out, "flame graph")
}

/// Draws a flame chart: `intervals` (stacks, root first, with their widths)
/// in time order, left to right, neither sorted nor merged (a frame spans
/// consecutive intervals that share it). An input without any non-zero
/// width is an error, as for [`write_svg`].
pub fn write_chart_svg<W, I, S, F>(out: W, intervals: I, options: &Options) -> io::Result<()>
where
    W: Write,
    I: IntoIterator<Item = (S, u64)>,
    S: IntoIterator<Item = F>,
    F: AsRef<str>,
{
    let mut lines: Vec<String> = Vec::new();
    let mut any = false;
    for (frames, w) in intervals {
        any |= w > 0;
        lines.push(format!("{} {w}", crate::folded::join(frames)));
    }
    if !any {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no interval with a width: nothing to draw"));
    }
    let mut opt = inferno_options(options);
    opt.flame_chart = true;
    // inferno draws a flame chart's lines last to first.
    lines.reverse();
    draw(&mut opt, &lines, out, "flame chart")
}

/// Has inferno draw `lines` (folded, `frames weight`) as the picture `what`.
fn draw(
    opt: &mut inferno::flamegraph::Options,
    lines: &[String],
    out: impl Write,
    what: &str,
) -> io::Result<()> {
    inferno::flamegraph::from_lines(opt, lines.iter().map(String::as_str), out)
        .map_err(|e| io::Error::other(format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quick_xml::events::Event;

    /// The `<title>` texts of the frames in `svg`.
    fn titles(svg: &str) -> Vec<String> {
        let mut r = quick_xml::Reader::from_str(svg);
        let (mut out, mut in_title) = (Vec::new(), false);
        loop {
            match r.read_event().expect("the SVG parses as XML") {
                Event::Start(e) if e.name().as_ref() == b"title" => in_title = true,
                Event::End(e) if e.name().as_ref() == b"title" => in_title = false,
                Event::Text(t) if in_title => out.push(t.decode().unwrap().into_owned()),
                Event::Eof => return out,
                _ => {}
            }
        }
    }

    #[test]
    fn draws_one_frame_per_node_with_the_total_at_the_root() {
        let stacks = [(vec!["main", "hot"], 60u64), (vec!["main", "warm"], 30), (vec!["main", "cool"], 10)];
        let mut svg = Vec::new();
        write_svg(&mut svg, stacks, &Options { count_name: "ns".into(), ..Options::default() }).unwrap();
        let t = titles(std::str::from_utf8(&svg).unwrap());
        assert!(t.iter().any(|t| t == "all (100 ns, 100%)"), "{t:?}");
        assert!(t.iter().any(|t| t == "main (100 ns, 100.00%)"), "{t:?}");
        assert!(t.iter().any(|t| t == "hot (60 ns, 60.00%)"), "{t:?}");
        assert!(t.iter().any(|t| t == "cool (10 ns, 10.00%)"), "{t:?}");
    }

    #[test]
    fn a_chart_keeps_time_order_and_every_frame() {
        let intervals = [
            (vec!["t", "main"], 10u64),
            (vec!["t", "main", "g"], 1),
            (vec!["t", "main"], 10),
            (vec!["t", "main", "g"], 1),
            (vec!["t", "main"], 10),
        ];
        let mut svg = Vec::new();
        let o = Options { count_name: "ns".into(), min_width: 0.0, ..Options::default() };
        write_chart_svg(&mut svg, intervals, &o).unwrap();
        let t = titles(std::str::from_utf8(&svg).unwrap());
        // Two calls of g stay two frames; main spans them all.
        assert_eq!(t.iter().filter(|t| t.starts_with("g (1 ns")).count(), 2, "{t:?}");
        assert_eq!(t.iter().filter(|t| t.starts_with("main (32 ns")).count(), 1, "{t:?}");
    }

    #[test]
    fn nothing_to_draw_is_an_error() {
        let e = write_svg(Vec::new(), [(vec!["main"], 0u64)], &Options::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
