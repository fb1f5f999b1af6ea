#!/usr/bin/env bash
# Install WordNet 3.0 for NLTK (METEOR's synonym matching) from Debian packages, offline-friendly and idempotent.
#
#   NLTK_DATA   where the NLTK data goes (default: .venv/nltk_data, which NLTK searches for the project's venv
#               as <sys.prefix>/nltk_data; spatialvqa.ctsvqa.metrics also adds $NLTK_DATA to nltk.data.path).
#   WORDNET_DIR where the Debian WordNet dict files are (default: /usr/share/wordnet).
#
# Debian's wordnet-base + wordnet-sense-index ship the WordNet 3.0 database NLTK reads, less the `lexnames`
# file, which is written here from the table of the lexnames(5WN) man page. Files are copied, not linked:
# NLTK's path pointers refuse files that resolve outside its data directories.
# Never fails the caller: when WordNet cannot be had it says why and exits 0 (METEOR then reports it missing).
set -u
NLTK_DATA="${NLTK_DATA:-.venv/nltk_data}"
WORDNET_DIR="${WORDNET_DIR:-/usr/share/wordnet}"
DEST="$NLTK_DATA/corpora/wordnet"
FILES="adj.exc adv.exc noun.exc verb.exc data.adj data.adv data.noun data.verb index.adj index.adv index.noun index.verb index.sense cntlist cntlist.rev"

say() { echo "setup_wordnet: $*"; }

have_dict() { [ -f "$WORDNET_DIR/data.noun" ] && [ -f "$WORDNET_DIR/index.sense" ]; }

if ! have_dict; then
    if [ "$(id -u)" != 0 ]; then
        say "WordNet not found in $WORDNET_DIR and not root: skipped (apt-get install wordnet-base wordnet-sense-index as root); METEOR will be reported missing"
        exit 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        say "WordNet not found in $WORDNET_DIR and no apt-get here: skipped; METEOR will be reported missing"
        exit 0
    fi
    say "installing wordnet-base and wordnet-sense-index with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || true
        if ! apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index >/dev/null 2>&1; then
            say "apt-get could not install wordnet-base/wordnet-sense-index: skipped; METEOR will be reported missing"
            exit 0
        fi
    fi
    if ! have_dict; then
        say "the packages installed but $WORDNET_DIR/data.noun is missing: skipped"
        exit 0
    fi
fi

mkdir -p "$DEST"
changed=0
for f in $FILES; do
    [ -f "$WORDNET_DIR/$f" ] || { say "warning: $WORDNET_DIR/$f missing"; continue; }
    if ! cmp -s "$WORDNET_DIR/$f" "$DEST/$f"; then
        rm -f "$DEST/$f"                       # replaces a symlink left by an earlier install
        cp "$WORDNET_DIR/$f" "$DEST/$f.tmp" && mv "$DEST/$f.tmp" "$DEST/$f" && changed=1
    fi
done

# lexnames(5WN): file number, lexicographer file name, syntactic category (1 noun, 2 verb, 3 adjective, 4 adverb)
lexnames() {
    local n=0 name pos
    for name in adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body \
        noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location noun.motive \
        noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process noun.quantity noun.relation \
        noun.shape noun.state noun.substance noun.time verb.body verb.change verb.cognition verb.communication \
        verb.competition verb.consumption verb.contact verb.creation verb.emotion verb.motion verb.perception \
        verb.possession verb.social verb.stative verb.weather adj.ppl; do
        case "$name" in noun.*) pos=1;; verb.*) pos=2;; adj.*) pos=3;; adv.*) pos=4;; esac
        printf '%02d\t%s\t%d\n' "$n" "$name" "$pos"
        n=$((n + 1))
    done
}
lexnames > "$DEST/lexnames.tmp"
if cmp -s "$DEST/lexnames.tmp" "$DEST/lexnames"; then rm -f "$DEST/lexnames.tmp"
else rm -f "$DEST/lexnames"; mv "$DEST/lexnames.tmp" "$DEST/lexnames"; changed=1; fi

if [ "$changed" = 1 ]; then say "WordNet 3.0 copied into $DEST"; else say "WordNet 3.0 already in $DEST"; fi
