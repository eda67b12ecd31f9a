"""The app's fixed words and browser snippets: the how-to panel, the API descriptions, small JS hooks."""

HOW_TO_READ = """<details id="how-to-read"><summary><b>How to read this</b> (five lines and the defaults)</summary>
<ol class="sd-howto">
<li><b>The idea.</b> A big model writes one token per forward pass. Speculative decoding lets cheap drafters guess
several tokens ahead, then checks every guess in <i>one</i> forward of the big (target) model.</li>
<li><b>Drafters.</b> <b>EAGLE-3</b> is one small layer that reads three of the target's layers and drafts the tree
token by token, each guess seeing the token above it. Medusa <b>heads</b> read the target's last hidden state: head
<i>k</i> guesses the token <i>k</i>+1 places ahead, blind to the guesses before it. <b>Prompt lookup</b> copies what
followed the same words earlier in the text.</li>
<li><b>The tree.</b> The guesses form a tree (columns = how far ahead); tree attention lets one target forward score
every node at once.</li>
<li><b>Verification.</b> From the root, the target accepts a guess <i>x</i> with probability p(<i>x</i>) (the guess
is a point mass, so this keeps the output exactly the target's law); at the first rejection it samples a
<b>correction</b>, after a fully accepted path it adds a <b>bonus</b> token.</li>
<li><b>Colours.</b> Tree: green accepted, red rejected, grey not reached. Text: green tokens were drafted and accepted,
orange corrections and blue bonus tokens came from the target. Click a token to see its round, and in the
sampler view the distribution it was drawn from.</li>
</ol>
<p class="sd-howto-defaults"><b>The defaults teach.</b> EAGLE-3's tree (the heads' trained tree where no EAGLE-3
drafter is loaded) with prompt lookup merged into it, temperature 0.7, shown at 2 rounds/s: most rounds draw a
tree with branches, and the model drafter, not only prompt lookup, makes most of the accepted drafts. Move a
sampler slider while a run plays and the next round shown uses it. The fastest settings (the heads' "auto" tree,
pace "fast") are for speed; Compare measures it, as the median of three interleaved pairs.</p></details>"""
# On a phone the settings start folded, below the output, and so do the live sliders, a bar at the foot of
# the screen that a tap opens (the how-to panel starts folded everywhere).
HOW_TO_READ_JS = """if (window.innerWidth < 700) {  // a phone
  for (const id of ['settings', 'live-panel']) {
    let tries = 0;
    const fold = setInterval(() => {
      const open = document.querySelector(`#${id} > button.label-wrap.open`);
      if (open) open.click();
      if (open || ++tries > 50) clearInterval(fold);
    }, 100);
  }
}"""
# A click (or tap) on a token: show its details below the stream, its round, and (by its position) its law.
TOKENS_JS = """element.addEventListener('click', (e) => {
  const t = e.target.closest('[data-round]');
  if (!t) return;
  const box = document.querySelector('#token-detail .sd-detail');
  if (box) box.textContent = (t.classList.contains('sd-tok') ? '“' + t.textContent + '” · ' : '') + (t.title || '');
  const position = t.classList.contains('sd-tok') ? [...element.querySelectorAll('.sd-tok')].indexOf(t) : -1;
  trigger('select', {index: Number(t.dataset.round), value: position});
});"""
# A new action: the token-detail line goes back to its hint (the last run's token is gone).
CLEAR_DETAIL_JS = """(...args) => {
  const box = document.querySelector('#token-detail .sd-detail');
  if (box) box.textContent = 'Click or tap a token for its details.';
  return args;
}"""
SCROLL_TO_RACE_JS = """(...args) => {
  setTimeout(() => document.getElementById('compare-box')?.scrollIntoView({block: 'start', behavior: 'smooth'}), 150);
  return args;
}"""

API = {
    "generate": "Generate text with speculative decoding and stream one update per round. Inputs: prompt (text); "
                "temperature 0-2 (0 = greedy); top_k 0-200 (0 = off); top_p (0, 1] (1 = off); min_p 0-1 (0 = off); "
                "max_new_tokens 1-512; seed (-1 = random); tree (a draft tree name); acceptance 'lossless', "
                "'greedy' or 'typical' (lossy); speculative (false = plain decoding); lookup 0-64 prompt-lookup "
                "tokens per round; lookup_mode 'first' or 'merge'; chat (wrap the prompt with the model's chat "
                "template). Rounds stream as fast as the engine makes them. The last output is a JSON record of the round.",
    "compare": "Race speculative decoding against plain decoding, or against another drafter and tree, on the same "
               "prompt, settings and seed. Same inputs as /generate, less `speculative`, then `versus`: 'plain' "
               "(default) or a value of the drafter-and-tree menu (`tree`'s choices). Returns the race table with "
               "the median ratio over interleaved pairs of runs, its range and its explanation, then both texts as HTML.",
    "stop": "Stop this client's running generation or race within one round.",
    "set_sampling": "Retune temperature, top_k, top_p and min_p live (a running generation applies them from its "
                    "next round) and return the sampler view at the current position.",
    "round": "Show round `round` of the last run: its draft tree, narration and full event (clamped to the run).",
    "clear": "Forget the last run and clear the outputs.",
}
