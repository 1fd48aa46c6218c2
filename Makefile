# The two commands of the Quickstart, and the pieces they are made of.
#   make demo   install what is missing, build, run the main job on this host
#   make test   install what is missing, build, run the whole suite (ctest)
#   make install   newt and libnewt under $(DESTDIR)$(PREFIX) (default /usr/local)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEWT_WERROR=ON
CTEST_FLAGS ?= -LE gpu

PREFIX ?= /usr/local

.PHONY: all build deps-build deps-test deps-demo test demo asan install clean

all: build

deps-build:
	@scripts/install-deps.sh build
deps-test:
	@scripts/install-deps.sh test
deps-demo:
	@scripts/install-deps.sh demo

$(BUILD)/CMakeCache.txt:
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: deps-build $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

test: deps-test build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

demo: deps-demo build
	@scripts/demo.sh $(BUILD)/newt

# newt, libnewt.so, libnewt.a, newt.h and newt.pc under $(DESTDIR)$(PREFIX) (bin, lib,
# include, lib/pkgconfig)
install: build
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

# The suite under AddressSanitizer and UBSan (CPU parts only).
asan:
	@$(MAKE) --no-print-directory test BUILD=build-asan CMAKE_FLAGS="-DNEWT_SANITIZE=address,undefined -DNEWT_CUDA=OFF"

clean:
	rm -rf $(BUILD) build-asan
