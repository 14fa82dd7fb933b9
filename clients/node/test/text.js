// Deterministic test text (a helper, not a test): seeded, and made of words for which code
// points, UTF-16 units and UTF-8 bytes all differ (accents, a combining sequence, CJK, emoji, a
// flag, a skin-tone modifier sequence), so a count in the wrong unit cannot pass.

const codePoints = (text) => [...text].length;

const ACCENTED_WORDS = ['café', 'naïve', 'Ærøskøbing', 'señor', 'über', 'façade', 'crème', 'Ångström',
  'e\u0301lan', 'Straße'];
const CJK_WORDS = ['日本語', '漢字', '中文测试', '東京', '한국어', 'データ', '検索結果'];
const EMOJI_WORDS = ['😀', '🚀', '🌍', '👍🏽', '🇫🇷', '🧪', '📦'];

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A seeded generator over `asciiWords`: { rng, randInt, pick, randomText(lengthInCodePoints), toolCallContent(length) }. */
function textGenerator(seed, asciiWords) {
  const rng = mulberry32(seed);
  const randInt = (lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));
  const pick = (items) => items[Math.floor(rng() * items.length)];
  function randomText(length) {
    let text = '';
    while (codePoints(text) < length) {
      const roll = rng();
      const pool = roll < 0.6 ? asciiWords : roll < 0.75 ? ACCENTED_WORDS : roll < 0.9 ? CJK_WORDS : EMOJI_WORDS;
      text += (text ? ' ' : '') + pick(pool);
    }
    // Cut at a code point (never inside a surrogate pair), so the text stays valid UTF-8.
    return [...text].slice(0, length).join('');
  }
  /** A tool call's JSON content of `length` code points, its query random text. */
  function toolCallContent(length) {
    const head = '{"name":"search","arguments":{"q":"';
    const tail = '"}}';
    return head + randomText(Math.max(1, length - codePoints(head) - codePoints(tail))) + tail;
  }
  return { rng, randInt, pick, randomText, toolCallContent };
}

// The words of the transcript tests' tool-heavy texts.
const TOOL_WORDS = ['the', 'tool', 'returned', 'rows', 'config', 'value', 'search', 'result', 'index',
  'timeout', 'retry', 'file', 'path', 'ok', 'error', 'list', 'context', 'window', 'budget', 'token'];

/**
 * What the sidecar stores and feeds for an event we sent: a role "tool" event's content (or one
 * marked untrusted) inside the untrusted-data block, as the capability document's
 * contextWindow.untrustedBlock describes it; any other event's content as sent. For content
 * with no spelling of the block's tag in it (ours never has one).
 */
function fedText(event, block) {
  if (event.role !== 'tool' && !event.untrusted) return event.content;
  const source = event.role === 'tool' ? 'tool' : 'data';
  return `<${block.tag} source="${source}">\n${block.preamble}\n${event.content}\n</${block.tag}>`;
}

export { TOOL_WORDS, codePoints, fedText, textGenerator };
