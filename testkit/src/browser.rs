//! Opening files in the viewers people use, offline: speedscope (npm)
//! served on 127.0.0.1 and Debian's Chromium, driven headless by npm
//! `playwright-core`, all in one browser launch.
//!
//! A profile (pprof, folded stacks, Chrome trace) is loaded with
//! speedscope's `#profileURL=`; an SVG is opened as a page. For each file
//! the page's title, its console warnings and errors, uncaught page errors
//! and any dialog (speedscope's "Unrecognized format" alert) are returned,
//! so a test can treat an importer's warning as a failure; for a profile,
//! also every profile speedscope made of it (a Chrome trace: one per
//! thread) with the symbols its sandwich view lists.
//!
//! speedscope picks its importer by name first: a file named `*.chrome.json`
//! is read as Chrome's own timeline format, not as trace events.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

/// The speedscope release the checks load.
pub const SPEEDSCOPE: &str = "speedscope@1.25.0";
/// The Playwright driver: the newest release that runs on Debian 12's
/// node 18 (later ones require node 20).
pub const PLAYWRIGHT: &str = "playwright-core@1.60.0";
/// Debian's Chromium.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// One profile speedscope made of a file (a thread of a Chrome trace).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Profile {
    /// Its name in speedscope's profile selector.
    pub name: String,
    /// The symbols its sandwich view lists.
    pub symbols: Vec<String>,
}

/// What one file did in the browser.
#[derive(Debug, Clone, Deserialize)]
pub struct Loaded {
    /// The file's name.
    pub file: String,
    /// The page title once loaded (speedscope: `NAME - speedscope`).
    pub title: String,
    /// Console messages of type warning or error (but Chromium's notes on
    /// its software WebGL driver, `[.WebGL-…] GL Driver Message …`).
    pub messages: Vec<String>,
    /// Uncaught exceptions of the page.
    pub errors: Vec<String>,
    /// Alerts, confirms and prompts the page raised.
    pub dialogs: Vec<String>,
    /// For an SVG: the `<title>` elements inside `<g>` frames.
    pub svg_frames: Option<usize>,
    /// For an SVG: every `<title>` element in it (a histogram's bars too).
    pub svg_titles: Option<usize>,
    /// For a profile: speedscope's profiles of it.
    #[serde(default)]
    pub profiles: Vec<Profile>,
}

impl Loaded {
    /// Whether the viewer took the file without any warning, error or dialog.
    pub fn clean(&self) -> bool {
        self.messages.is_empty() && self.errors.is_empty() && self.dialogs.is_empty()
    }
}

const SCRIPT: &str = r#"
const http = require('http'), fs = require('fs'), path = require('path');
const { chromium } = require('playwright-core');
const [dist, chromiumPath, ...files] = process.argv.slice(2);
const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml',
                '.png': 'image/png', '.json': 'application/json', '.txt': 'text/plain' };
const server = http.createServer((req, res) => {
  const u = decodeURIComponent(new URL(req.url, 'http://127.0.0.1').pathname);
  let p = null;
  if (u === '/favicon.ico') { res.writeHead(204); res.end(); return; }
  if (u.startsWith('/files/')) p = files.find(f => path.basename(f) === u.slice(7));
  else { const q = path.normalize(path.join(dist, u === '/' ? 'index.html' : u)); if (q.startsWith(dist)) p = q; }
  if (!p) { res.writeHead(404); res.end(); return; }
  fs.readFile(p, (err, data) => {
    if (err) { res.writeHead(404); res.end(); return; }
    res.writeHead(200, { 'Content-Type': types[path.extname(p)] || 'application/octet-stream' });
    res.end(data);
  });
});
// speedscope's sandwich view (key 3) of each profile (key n steps to the next).
async function profiles(page) {
  const text = () => page.evaluate(() => document.body.innerText);
  const of = (t) => { const m = t.match(/\((\d+)\/(\d+)\)/); return m ? Number(m[2]) : 1; };
  await page.keyboard.press('3');
  const out = [];
  const n = of(await text());
  for (let k = 0; k < n; k++) {
    await page.waitForTimeout(300);
    const lines = (await text()).split('\n').map(l => l.trim()).filter(l => l.length > 0);
    const name = (lines.find(l => /\(\d+\/\d+\)$/.test(l)) || '').replace(/\s*\(\d+\/\d+\)$/, '');
    const at = lines.findIndex(l => /Symbol Name$/.test(l));
    // Rows are total, self, symbol.
    const symbols = at < 0 ? [] : lines.slice(at + 1).filter((_, j) => j % 3 === 2);
    out.push({ name, symbols });
    await page.keyboard.press('n');
  }
  return out;
}
server.listen(0, '127.0.0.1', async () => {
  const base = `http://127.0.0.1:${server.address().port}`;
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox', '--disable-gpu',
    '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
  const out = [];
  for (const f of files) {
    const file = path.basename(f);
    const r = { file, title: '', messages: [], errors: [], dialogs: [], svg_frames: null, svg_titles: null, profiles: [] };
    const page = await browser.newPage({ viewport: { width: 1600, height: 2400 } });
    // Chromium's own notes about its software GL driver are not the page's.
    page.on('console', m => { if ((m.type() === 'warning' || m.type() === 'error') && !m.text().startsWith('[.WebGL-'))
      r.messages.push(`${m.type()}: ${m.text()}`); });
    page.on('pageerror', e => r.errors.push(String(e)));
    page.on('dialog', d => { r.dialogs.push(d.message()); d.dismiss().catch(() => {}); });
    try {
      if (file.endsWith('.svg')) {
        await page.goto(`${base}/files/${encodeURIComponent(file)}`, { waitUntil: 'load' });
        r.svg_frames = await page.locator('svg g > title').count();
        r.svg_titles = await page.locator('svg title').count();
        r.title = await page.title();
      } else {
        const url = `${base}/files/${encodeURIComponent(file)}`;
        await page.goto(`${base}/index.html#profileURL=${encodeURIComponent(url)}`, { waitUntil: 'load' });
        await page.waitForFunction(n => document.title.startsWith(n), file, { timeout: 30000 });
        // Importer warnings come while the profile is processed and drawn.
        await page.waitForTimeout(1000);
        r.title = await page.title();
        if (r.dialogs.length === 0) r.profiles = await profiles(page);
      }
    } catch (e) { r.errors.push(`${e}`); r.title = await page.title().catch(() => ''); }
    out.push(r);
    await page.close();
  }
  await browser.close();
  server.close();
  console.log(JSON.stringify(out));
});
"#;

/// Installs what the checks need (Debian's chromium, nodejs and npm where
/// absent, speedscope and playwright-core into `cache`, a directory of the
/// build tree), or says why it cannot.
pub fn prepare(cache: &Path) -> Result<PathBuf, String> {
    crate::debian_package("chromium", || Path::new(CHROMIUM).exists())?;
    crate::debian_package("nodejs", || crate::runs("node", &["--version"]))?;
    crate::debian_package("npm", || crate::runs("npm", &["--version"]))?;
    std::fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let lock = std::fs::File::open(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("lock {}: {e}", cache.display()))?;
    let installed = |spec: &str| {
        let (name, version) = spec.split_once('@').unwrap_or((spec, ""));
        let manifest = cache.join("node_modules").join(name).join("package.json");
        std::fs::read_to_string(manifest).is_ok_and(|m| m.contains(&format!("\"version\": \"{version}\"")))
    };
    if !installed(SPEEDSCOPE) || !installed(PLAYWRIGHT) {
        let o = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--no-save", "--prefix"])
            .arg(cache)
            .args([SPEEDSCOPE, PLAYWRIGHT])
            .output()
            .map_err(|e| format!("cannot run npm: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "npm install {SPEEDSCOPE} {PLAYWRIGHT}: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
    }
    Ok(cache.to_path_buf())
}

/// Opens each of `files` (profiles in speedscope, `.svg` files as pages)
/// in one headless Chromium; `cache` as for [`prepare`]. Files are served
/// by name: give each a different one.
pub fn open(cache: &Path, files: &[PathBuf]) -> Result<Vec<Loaded>, String> {
    let cache = prepare(cache)?;
    let dist = cache.join("node_modules/speedscope/dist/release");
    let script = cache.join("open-in-browser.js");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    let o = Command::new("node")
        .arg(&script)
        .arg(&dist)
        .arg(CHROMIUM)
        .args(files)
        .env("NODE_PATH", cache.join("node_modules"))
        .current_dir(&cache)
        .output()
        .map_err(|e| format!("cannot run node: {e}"))?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        return Err(format!("the browser check failed: {}{stdout}", String::from_utf8_lossy(&o.stderr)));
    }
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| format!("browser check output {line:?}: {e}"))
}
